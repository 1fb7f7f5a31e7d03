"""speclite's AVX2 CPU matrix products (kernels/cpu/gemm_avx2.cpp): int4, int8 (W8A8) and bf16/f16.

One C call per matmul, any number of rows (decode, k+1 verification and prefill take the same
kernel), threads from torch.get_num_threads(). Weights are repacked once at load (pack_int4,
pack_int8); activations arrive in fp32, bf16 or f16 and the output has their dtype. A row's result
does not depend on the other rows of the call (see the source), which keeps speculative decoding
bit-identical to plain decoding. Built by cpu_build with explicit -mavx2 -mfma -mf16c (not
-march=native), so an AVX-512 machine builds and runs this same AVX2 code. `available()` is False
without such a CPU or compiler, or with SPECLITE_CPU_KERNELS=0: callers keep torch's ops.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from speclite.kernels import cpu_build

FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC", "-std=c++17")
DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_P, _I = ctypes.c_void_p, ctypes.c_int


def available() -> bool:
    return _library() is not None


def takes(x: torch.Tensor) -> bool:
    """Whether x (2-D activations) can go through these kernels."""
    return x.device.type == "cpu" and x.dtype in DTYPES and available()


def pack_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int):
    """Values q [N, K] (0..15, columns in group order), scales [G, N], zeros [G, N] with
    w = (q - zero) * scale per group of `group` (a multiple of 32) consecutive columns, into the
    kernel's layout: per column, 32-value blocks as 16 bytes (value j low nibble, j+16 high), scales
    fp16 [N, G] and zeros uint8 [N, G]."""
    n, k = q.shape
    nb = -(-k // 32)
    blocks = torch.nn.functional.pad(q.to(torch.uint8), (0, nb * 32 - k)).view(n, nb, 2, 16)
    packed = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, nb * 16).contiguous()
    return packed, scales.t().to(torch.float16).contiguous(), zeros.t().to(torch.uint8).contiguous()


def int4_gemm(x: torch.Tensor, packed, k: int, group: int) -> torch.Tensor:
    """x [M, K] @ W^T for pack_int4's W: activations quantized to int8 per 32 values."""
    qw, scales, zeros = packed
    x = x.contiguous()
    m, n = x.shape[0], qw.shape[0]
    y = torch.empty(m, n, dtype=x.dtype)
    _library().speclite_int4_gemm(x.data_ptr(), DTYPES[x.dtype], qw.data_ptr(), scales.data_ptr(), zeros.data_ptr(),
                                  y.data_ptr(), m, n, k, group, torch.get_num_threads())
    return y


def pack_int8(w: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] padded with zero columns to K a multiple of 32."""
    k = w.shape[1]
    return torch.nn.functional.pad(w.to(torch.int8), (0, -k % 32)).contiguous()


def int8_gemm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, k: int) -> torch.Tensor:
    """x [M, K] @ (w * scale)^T with x quantized to int8 per row (W8A8); w from pack_int8, scale fp32 [N]."""
    x = x.contiguous()
    m, n = x.shape[0], w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype)
    _library().speclite_int8_gemm(x.data_ptr(), DTYPES[x.dtype], w.data_ptr(), scale.data_ptr(), y.data_ptr(),
                                  m, n, k, torch.get_num_threads())
    return y


def half_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w^T for contiguous bf16 or f16 w [N, K], fp32 arithmetic."""
    x = x.contiguous()
    m, (n, k) = x.shape[0], w.shape
    y = torch.empty(m, n, dtype=x.dtype)
    _library().speclite_half_gemm(x.data_ptr(), DTYPES[x.dtype], w.data_ptr(), DTYPES[w.dtype], y.data_ptr(),
                                  m, n, k, torch.get_num_threads())
    return y


@functools.cache
def _library():
    return cpu_build.load("avx2", "gemm_avx2.cpp", FLAGS, {
        "speclite_int4_gemm": [_P, _I, _P, _P, _P, _P, _I, _I, _I, _I, _I],
        "speclite_int8_gemm": [_P, _I, _P, _P, _P, _I, _I, _I, _I],
        "speclite_half_gemm": [_P, _I, _P, _I, _P, _I, _I, _I, _I],
    })
