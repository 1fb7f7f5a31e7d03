"""Sampling on the CPU in speclite's kernels (kernels/cpu/sampling.h): a request's warp of logits
rows into probabilities and the fixed-point inverse-CDF draw, on the calling thread. The Python loop's
warps and draws on the CPU are these, so the kernels' loops that sample many tokens in one call give
the tokens of its iterations one by one. `takes()` is False where the kernels are not available (the
torch path of speclite.sampling then runs)."""

from __future__ import annotations

import ctypes

import torch

from speclite.kernels import cpu_build
from speclite.kernels.cpu_layer_ops import DTYPES

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class Warp(ctypes.Structure):
    """A request's warp for the kernels' sampling loops (speclite.sampling.SamplingParams' temperature,
    top_k, top_p). Mirrors struct Warp in sampling.h."""

    _fields_ = [("temperature", _F), ("top_k", _I), ("top_p", _F)]

    @classmethod
    def of(cls, params) -> "Warp":
        return cls(params.temperature, params.top_k, params.top_p)


def takes(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in DTYPES and _library() is not None


def warp(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """float32 probabilities [..., V] of logits [..., V] after temperature, top-k, then top-p (see
    warp_row in sampling.h for the exact arithmetic)."""
    x = logits.contiguous()
    probs = torch.empty(x.shape, dtype=torch.float32)
    v = x.shape[-1]
    _library().speclite_warp(x.data_ptr(), DTYPES[x.dtype], x.numel() // v, v, temperature, top_k, top_p,
                             probs.data_ptr())
    return probs


def draw(weights: torch.Tensor, u: float) -> int:
    """One inverse-CDF draw from non-negative weights [V] with the uniform u, on the fixed-point grid of
    speclite.kernels.verify.sample_fixed_point (the same token)."""
    w = weights.to(torch.float32).contiguous()
    return _library().speclite_draw(w.data_ptr(), w.numel(), u)


SIGNATURES = {
    "speclite_warp": [_P, _I, _I, _I, _F, _I, _F, _P],
    "speclite_draw": [_P, _I, _F],
}


def _library():
    return cpu_build.load("kernels.cpp", SIGNATURES)
