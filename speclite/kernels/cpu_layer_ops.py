"""speclite's AVX2 CPU kernels for a decoder layer's non-matmul work (kernels/cpu/layer_ops_avx2.cpp):
RMSNorm, SwiGLU, and RoPE + KV-cache write + attention, one C call each instead of ~30 torch ops per
layer.

Rows are computed independently of each other (speculative verification stays bit-identical to
plain decoding). `available()` is False without an AVX2 CPU or a compiler, or with
SPECLITE_CPU_KERNELS=0: the decoder keeps its torch ops.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from speclite.kernels import cpu_build

FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC", "-std=c++17")
DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


def available() -> bool:
    return _library() is not None


def takes(x: torch.Tensor) -> bool:
    """Whether x can go through these kernels (a contiguous CPU tensor of a supported dtype)."""
    return x.device.type == "cpu" and x.dtype in DTYPES and available()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * round(x / sqrt(mean(x^2) + eps)) over the last dimension, weight of x's dtype."""
    x = x.contiguous()
    y = torch.empty_like(x)
    _library().speclite_rms_norm(x.data_ptr(), weight.data_ptr(), y.data_ptr(), DTYPES[x.dtype],
                                 x.numel() // x.shape[-1], x.shape[-1], eps)
    return y


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [M, 2I] (gate columns first), rounded as torch rounds it."""
    gate_up = gate_up.contiguous()
    m, i = gate_up.shape[0], gate_up.shape[1] // 2
    y = torch.empty(m, i, dtype=gate_up.dtype)
    _library().speclite_swiglu(gate_up.data_ptr(), y.data_ptr(), DTYPES[gate_up.dtype], m, i)
    return y


def attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
              heads: int, kv_heads: int, start: int, keys: int, mask: torch.Tensor | None) -> torch.Tensor:
    """RoPE on q and k of the projections qkv [t, (heads + 2 kv_heads) d], k and v written to the
    cache [kv_heads, max_len, d] at start.., and attention [t, heads d] over cache keys 0..keys-1
    (mask [t, keys] bool; None: causal from start)."""
    t, d = qkv.shape[0], cache_k.shape[-1]
    out = torch.empty(t, heads * d, dtype=qkv.dtype)
    mask = None if mask is None else mask.to(torch.uint8).contiguous()
    _library().speclite_attention(
        qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), cache_k.data_ptr(), cache_v.data_ptr(), out.data_ptr(),
        None if mask is None else mask.data_ptr(), DTYPES[qkv.dtype], t, heads, kv_heads, d, cache_k.shape[1], start,
        keys, d ** -0.5, torch.get_num_threads())
    return out


@functools.cache
def _library():
    return cpu_build.load("avx2", "layer_ops_avx2.cpp", FLAGS, {
        "speclite_rms_norm": [_P, _P, _P, _I, _I, _I, _F],
        "speclite_swiglu": [_P, _P, _I, _I, _I],
        "speclite_attention": [_P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _I, _F, _I],
    })
