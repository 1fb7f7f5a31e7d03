"""Loaded models' CPU weights moved into one memory mapping advised for transparent huge pages.

A decode step streams every weight once. Left where loading put them, the weights lie in hundreds
of separate allocations, partly in 4 KB pages (small tensors and the tail of each big one; Linux's
default THP mode, `madvise`, gives huge pages only to memory advised for them). One anonymous
mapping advised MADV_HUGEPAGE, the tensors laid out in the order the forward reads them, made whole
decode steps 1.035x (bf16), 1.10x (int4) and 1.22-1.25x (W8A8) faster on an AMX Xeon than torch's
own huge-page allocations (benchmarks/RESULTS.md, 2026-11-25). Linux only; elsewhere the models stay
as they are.
"""

from __future__ import annotations

import mmap

import torch
from torch import nn

from speclite.kernels import cpu_gemm

ALIGN = 64  # bytes: each tensor starts on a cache line


def settle(*models: nn.Module) -> torch.Tensor | None:
    """Move every contiguous CPU parameter and buffer of `models` into one arena, in module order,
    and return it (None where there is nothing to move, no MADV_HUGEPAGE or no room for a mapping).
    A tensor that several modules or models hold (tied embeddings, a head reading the target's
    table) is copied once and stays shared. Call before the first forward: kernels keep pointers to
    the weights they were built for. Each tensor is copied and let go in turn, so memory peaks at
    the models plus their largest tensor, not twice the models."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    # First the layout (keys only: holding the tensors here would keep every old copy alive).
    slots, size = {}, 0
    for _, _, t in _tensors(models):
        if _key(t) not in slots:
            slots[_key(t)] = size
            size += -(-t.nbytes // ALIGN) * ALIGN
    if size == 0:
        return None
    try:
        arena = cpu_gemm.huge_mapping(size)  # advised before the first touch: the copies fault in huge pages
    except OSError:  # no room for the mapping (strict overcommit): the weights stay where they are
        return None
    moved, placed = {}, set()
    for table, name, t in _tensors(models):
        if id(t) in placed:  # met again through a module two models share
            continue
        key = _key(t)
        if key not in moved:
            start = slots[key]
            view = arena[start:start + t.nbytes].view(t.dtype).view(t.shape)
            view.copy_(t)
            moved[key] = nn.Parameter(view, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else view
            placed.add(id(moved[key]))
        table[name] = moved[key]
    return arena


def _key(t: torch.Tensor) -> tuple:
    return t.data_ptr(), t.dtype, tuple(t.shape)


def _tensors(models):
    """(dict, name, tensor) for every contiguous CPU parameter and buffer of the models (repeats
    included: a module shared by two models, a tensor tied into two modules). Subclasses that carry
    state of their own (bitsandbytes' packed parameters) stay where they are."""
    for model in models:
        for module in model.modules():
            for table in (module._parameters, module._buffers):
                for name, t in list(table.items()):
                    cpu = type(t) in (torch.Tensor, nn.Parameter) and t.device.type == "cpu"
                    if cpu and t.is_contiguous() and t.numel():
                        yield table, name, t
