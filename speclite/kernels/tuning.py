"""Per-shape launch-config selection for the Triton GEMMs.

We tune ourselves instead of using triton.autotune because split-K configs need a
workspace sized by the chosen split, allocated before the launch. The first call for a
(kernel, shape bucket) key times every candidate with CUDA events and keeps the fastest;
later calls are a dict lookup. Call each shape once before capturing a CUDA graph.
Under the interpreter (CPU tensors) nothing is timed: the first candidate is used.
"""

from dataclasses import dataclass
from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


_best: dict = {}


# A decode step and a verification (at most 64 drafts + 1 rows: the API's cap on k) share one
# launch config per shape, so every such row count sums K in the same order (the same BLOCK_K and
# split): a token's logits from a k + 1-row verification are bit for bit its one-row step's, and
# greedy speculation gives plain decoding's tokens on a GPU too. Per-M picks broke that.
GEMV_ROWS = 65


def m_bucket(m: int) -> int:
    """Every M up to GEMV_ROWS shares a config; larger (prefill) shapes share one per power of two."""
    return GEMV_ROWS if m <= GEMV_ROWS else 1 << (m - 1).bit_length()


def gemm_candidates(m: int, k_tiles_of: Callable[[int], int]) -> list:
    """Candidate configs: GEMV-shaped split-K (16-row tiles, a grid row per 16 rows) for decode and
    verification, tiled for prefill.

    k_tiles_of(block_k) says how many K tiles a block_k gives, so useless splits are dropped.
    The lists cover the linear shapes of 0.5B-8B Llama/Qwen layers (N, K in 896..18944).
    """
    if m <= GEMV_ROWS:
        base = [GemmConfig(16, bn, bk, s, 4, 3) for bn in (32, 64, 128) for bk in (64, 128, 256) for s in (1, 2, 4, 8, 16)]
    else:
        base = [
            GemmConfig(64, 64, 64, 1, 4, 4), GemmConfig(64, 128, 64, 1, 4, 4), GemmConfig(128, 64, 64, 1, 4, 4),
            GemmConfig(128, 128, 64, 1, 8, 3), GemmConfig(128, 128, 32, 1, 4, 4), GemmConfig(128, 256, 64, 1, 8, 3),
            GemmConfig(64, 256, 32, 1, 4, 4), GemmConfig(256, 128, 64, 1, 8, 3),
        ]
    return [c for c in base if c.split_k <= k_tiles_of(c.block_k)]


def pick(key: tuple, candidates: Sequence[GemmConfig], run: Callable[[GemmConfig], object], device: torch.device):
    """Return the fastest candidate for key, timing them on first use (CUDA only)."""
    if key in _best:
        return _best[key]
    if device.type != "cuda" or len(candidates) == 1:
        return candidates[0]
    _best[key] = min(candidates, key=lambda cfg: _median_ms_or_inf(lambda: run(cfg)))
    return _best[key]


def _median_ms_or_inf(fn: Callable[[], object]) -> float:
    from triton.runtime.errors import OutOfResources

    try:
        return gpu_median_ms(fn)
    except OutOfResources:  # a tile too big for this GPU's shared memory or registers: not a candidate here
        return float("inf")


# Cycles the GPU spins before each timed call (~0.25 ms at 2 GHz): the host enqueues the call
# meanwhile, so the events time its kernels alone, as a CUDA graph replays them. Without it a
# 5-30 us kernel is timed at the host's launch cost, and the tuner picked among candidates at
# random (an H200's 7B layers ran 10x slower at one row count than at the next).
_HOST_AHEAD_CYCLES = 500_000


def gpu_median_ms(fn: Callable[[], object], reps: int = 20, before: Callable[[], object] | None = None) -> float:
    """Median GPU time of fn's kernels in ms, after one untimed call (compilation, warm-up).
    before: run ahead of each timed call, untimed (an L2 flush, say)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        torch.cuda._sleep(_HOST_AHEAD_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]
