"""Row chunks for the round-to-nearest quantizers (int4, fp8-block, int8).

Each chunk's float32 copy (CHUNK_ELEMENTS floats, 2 MB) stays in cache through the quantizer's
passes (copy, min/max, divide, round, clamp, convert), where whole-tensor passes each went to
memory: 2-3x faster on the 2-core dev machine (benchmarks/quant_kernels.py). Rows are independent
(every group, block and channel lies within a row band), so chunking changes no value.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Callable, Iterator

import torch

CHUNK_ELEMENTS = 1 << 19


def row_slices(rows: int, row_elements: int, multiple: int = 1) -> list[slice]:
    """Bands of about CHUNK_ELEMENTS elements, each a whole number of `multiple` rows (the last may be short)."""
    step = max(multiple, CHUNK_ELEMENTS // max(1, row_elements) // multiple * multiple)
    return [slice(r, min(r + step, rows)) for r in range(0, rows, step)]


def run_chunks(fn: Callable[[slice], None], slices: list[slice], pool: Executor | None) -> None:
    if pool is None:
        for s in slices:
            fn(s)
    else:
        list(pool.map(fn, slices))  # re-raises a chunk's exception


@contextlib.contextmanager
def chunk_workers() -> Iterator[Executor | None]:
    """torch.get_num_threads() worker threads taking whole chunks, each op single-threaded meanwhile.

    On a busy machine one descheduled OpenMP thread stalls the barrier of every op split across
    threads (2 OpenMP threads ran the int4 math 5x slower than one at load 14 on 2 cores); a
    descheduled worker delays only its own chunk. torch's ops release the GIL.
    """
    workers = torch.get_num_threads()
    if workers < 2:
        yield None
        return
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="speclite-quant") as pool:
            yield pool
    finally:
        torch.set_num_threads(workers)
