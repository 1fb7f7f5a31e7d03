"""speclite's AVX-512 BF16 CPU kernel (kernels/cpu/gemv.cpp): bf16 rows times bf16 weights.

Built once per machine by cpu_build (-march=native). Where there is no compiler, no AVX-512 BF16,
SPECLITE_CPU_KERNELS=0 or SPECLITE_CPU_ISA=avx2, `available()` is False and callers take the AVX2
kernels (cpu_gemm) or torch's ops. Measured on the
2-core dev CPU (benchmarks/cpu_gemv.py): the Qwen2.5-0.5B decode matmuls stream at ~22-24 GB/s
against torch.mv's ~20-21.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from speclite.kernels import cpu_build

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
_P = ctypes.c_void_p
_I = ctypes.c_int


def available() -> bool:
    return _library() is not None


def gemm_bf16(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """bf16 rows x [M, K] times bf16 w [N, K]^T on the CPU, K % 32 == 0, both contiguous: fp32 [M, N].
    A row's result does not depend on the other rows of the call."""
    (m, k), n = x.shape, w.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    _library().speclite_gemm_bf16(w.data_ptr(), x.data_ptr(), y.data_ptr(), m, n, k, torch.get_num_threads())
    return y


@functools.cache
def _library():
    return cpu_build.load("avx512_bf16", "gemv.cpp", FLAGS, {"speclite_gemm_bf16": [_P, _P, _P, _I, _I, _I, _I]})
