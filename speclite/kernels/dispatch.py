"""Which path a kernel call takes: Triton on CUDA tensors, torch everywhere else.

The switch to force the torch path on CUDA (for comparison and debugging) is the
environment variable SPECLITE_FORCE_TORCH=1, read once at import, or force_torch(flag).
Triton is never imported here: a CPU-only install without triton must import this package.
"""

import importlib.util
import os

import torch

_forced_torch = os.environ.get("SPECLITE_FORCE_TORCH", "").strip().lower() not in ("", "0", "false", "no")
_has_triton = importlib.util.find_spec("triton") is not None


def force_torch(flag: bool) -> None:
    """Route every kernel call through the torch path, even for CUDA tensors."""
    global _forced_torch
    _forced_torch = bool(flag)


def torch_forced() -> bool:
    return _forced_torch


def triton_available() -> bool:
    return _has_triton


def use_triton(t: torch.Tensor) -> bool:
    """True when a call on tensor t should run the Triton kernel."""
    return t.is_cuda and _has_triton and not _forced_torch


def fp8_dot_supported(t: torch.Tensor) -> bool:
    """Triton's fp8 e4m3 tl.dot needs compute capability 8.9 (Ada) or newer."""
    return torch.cuda.get_device_capability(t.device) >= (8, 9)
