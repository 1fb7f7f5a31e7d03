"""torch's own CPU ops between two calls of the kernels' thread team, on the calling thread alone.

torch spreads an op over its OpenMP threads (a copy or an elementwise op past 32768 values; a softmax
over a long last dimension even for one row), and libgomp's idle threads then spin for milliseconds on
the cores the team (kernels/cpu/team.h) needs for the next forward. Sampled decoding's warps, draws and
verdicts sit between forwards every iteration: on the embedded pair with 2 threads, vanilla k=4 at
temperature 0.8 ran at 684 tok/s with them spreading, 1371 under OMP_WAIT_POLICY=passive
(benchmarks/RESULTS.md, 2026-11-26). Their work is small (a few vocabulary rows), so one thread loses
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread(device: torch.device) -> Iterator[None]:
    """torch's ops inside run on the calling thread where `device` is the CPU (no team call inside:
    the team takes torch's thread count as its size)."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
