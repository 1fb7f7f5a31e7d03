"""Per-tensor RTN throughput of `speclite quantize`: the math before and after row chunking, same tensors, same run.

    python benchmarks/quant_kernels.py --shapes 4864x896,896x4864,18944x3584 --repeats 7

For each bf16 weight shape and scheme (int4 g128 asym to the GPTQ layout, fp8-block, w8a8): MB/s of
bf16 input for the code before chunking (whole-tensor passes, frozen below from commit 1b9a106) with
torch's own threads, as it ran, and with one thread (what chunking alone gains), and for today's
(row chunks on chunk_workers(), as quantize runs them),
called alternately, medians of --repeats; and the MB/s of a bf16 memcpy of the same tensor into a
buffer allocated once (memory bandwidth, no page faults) in the same run as the ceiling. Each pair of outputs is checked bit for bit. The machine may be
shared: compare the ratios, and the load average printed at the start and the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from speclite.quant.fp8 import FP8, FP8_MAX, quantize_fp8_blocks
from speclite.quant.int4 import Int4Weight, group_params, quantize_values_, rtn_gptq, to_gptq
from speclite.quant.int8 import quantize_int8_channel
from speclite.quant.rows import chunk_workers


# --- before: the RTN math as of commit 1b9a106 (whole-tensor passes) ---

def before_int4(weight: torch.Tensor, group_size: int = 128, sym: bool = False) -> dict[str, torch.Tensor]:
    n, k = weight.shape
    groups = -(-k // group_size)
    w = torch.zeros(n, groups * group_size) if groups * group_size > k else torch.empty(n, k)
    w[:, :k] = weight
    w = w.view(n, groups, group_size)
    scale, zero = group_params(w, sym)
    q = quantize_values_(w, scale[..., None], zero[..., None]).view(n, -1)[:, :k]
    return to_gptq(Int4Weight(q=q.to(torch.uint8).contiguous(), zeros=zero.t().to(torch.uint8).contiguous(),
                              scales=scale.t().half().contiguous(),
                              g_idx=(torch.arange(k) // group_size).to(torch.int32), group_size=group_size), "bench")


def before_fp8(weight: torch.Tensor, block=(128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    bn, bk = block
    n, k = weight.shape
    nb, kb = -(-n // bn), -(-k // bk)
    padded = (nb * bn, kb * bk) != (n, k)
    w = torch.zeros(nb * bn, kb * bk) if padded else torch.empty(n, k)
    w[:n, :k] = weight
    tiles = w.view(nb, bn, kb, bk)
    amax = torch.maximum(tiles.amax(dim=(1, 3)), -tiles.amin(dim=(1, 3)))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    values = tiles.div_(scale[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8).view(nb * bn, kb * bk)
    return (values[:n, :k].contiguous() if padded else values), scale.contiguous()


def before_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = weight.to(torch.float32, copy=True)
    wmin, wmax = torch.aminmax(w, dim=1, keepdim=True)
    amax = torch.maximum(-wmin, wmax)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    return w.div_(scale).round_().clamp_(-127, 127).to(torch.int8), scale


SCHEMES = {
    "int4": (before_int4, lambda w, pool: rtn_gptq(w, 128, False, "bench", pool)),
    "fp8-block": (before_fp8, lambda w, pool: quantize_fp8_blocks(w, (128, 128), pool)),
    "w8a8": (before_int8, lambda w, pool: quantize_int8_channel(w, pool)),
}


def same(a, b) -> bool:
    a, b = (a.values() if isinstance(a, dict) else a), (b.values() if isinstance(b, dict) else b)
    return all(x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))


def timed(fns: list, repeats: int) -> list[float]:
    """Median seconds of each fn, called in turn (one round after another) so that load hits all alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for t, fn in zip(times, fns):
            start = time.perf_counter()
            fn()
            t.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4864x896,896x4864,18944x3584", help="NxK bf16 weights")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; {os.cpu_count()} cores; "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'shape':<12} {'scheme':<10} {'memcpy MB/s':>12} {'before MB/s':>12} {'before 1t':>10} "
          f"{'after MB/s':>11} {'after/before':>13} {'after/before 1t':>16} {'after/memcpy':>13}")
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        w = (torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.02).bfloat16()
        mb = w.numel() * w.element_size() / 1e6
        for scheme in args.schemes.split(","):
            before, after = SCHEMES[scheme]
            threads = torch.get_num_threads()
            dst = torch.empty_like(w)
            with chunk_workers() as pool:
                # before: torch's own threads, as it ran; after: chunks on the pool, ops single-threaded.
                def run_before():
                    torch.set_num_threads(threads)
                    return before(w)

                def run_before_1t():
                    torch.set_num_threads(1)
                    return before(w)

                def run_after():
                    torch.set_num_threads(1 if pool else threads)
                    return after(w, pool)

                assert same(run_before(), run_after()), f"{scheme} {shape}: outputs differ"
                copy_s, before_s, before1_s, after_s = timed([lambda: dst.copy_(w), run_before, run_before_1t, run_after],
                                                             args.repeats)
            torch.set_num_threads(threads)
            print(f"{shape:<12} {scheme:<10} {mb / copy_s:>12.0f} {mb / before_s:>12.0f} {mb / before1_s:>10.0f} "
                  f"{mb / after_s:>11.0f} {before_s / after_s:>13.2f} {before1_s / after_s:>16.2f} "
                  f"{copy_s / after_s:>13.3f}", flush=True)
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
