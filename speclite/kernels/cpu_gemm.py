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
_PP, _IP = ctypes.POINTER(_P), ctypes.POINTER(_I)


def available() -> bool:
    return _library() is not None


def takes(x: torch.Tensor) -> bool:
    """Whether x (2-D activations) can go through these kernels."""
    return x.device.type == "cpu" and x.dtype in DTYPES and available()


def pack_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int):
    """Values q [N, K] (0..15, columns in group order), scales [G, N], zeros [G, N] with
    w = (q - zero) * scale per group of `group` (a multiple of 32) consecutive columns, into the
    kernel's layout (gemm_avx2.cpp, Int4): per 8 columns (N padded with zero columns) and 32-block,
    128 bytes of nibbles; scales fp16 and zeros uint8 [N / 8, G, 8]."""
    n, k = q.shape
    ng, nb = -(-n // 8), -(-k // 32)
    q = torch.nn.functional.pad(q.to(torch.uint8), (0, nb * 32 - k, 0, ng * 8 - n))
    # [group, column, block, run j, byte] -> sets A = columns 0,1,4,5 and B = 2,3,6,7 -> [group, block, set, j, 32]
    runs = q.view(ng, 8, nb, 4, 8)[:, [0, 1, 4, 5, 2, 3, 6, 7]].view(ng, 2, 4, nb, 4, 8)
    u = runs.permute(0, 3, 1, 4, 2, 5).reshape(ng, nb, 2, 4, 32)
    packed = (u[:, :, :, :2] | (u[:, :, :, 2:] << 4)).reshape(ng, nb * 128).contiguous()

    def per_group(t, dtype):
        return torch.nn.functional.pad(t.t().to(dtype), (0, 0, 0, ng * 8 - n)).view(ng, 8, -1).transpose(1, 2).contiguous()

    return packed, per_group(scales, torch.float16), per_group(zeros, torch.uint8)


class Int4Matrices:
    """One or more pack_int4 matrices of the same input width and group (a layer's q, k and v
    projections), multiplied in one kernel call: the activations are quantized once and one thread
    team splits all the columns. The pointer arrays are built once: the weights never move."""

    def __init__(self, packs, ns: list[int], k: int, group: int):
        self.packs, self.n, self.k, self.group = packs, sum(ns), k, group
        parts = len(packs)
        self.args = [ctypes.c_int(parts)] + [(_P * parts)(*(p[i].data_ptr() for p in packs)) for i in range(3)]
        self.args.append((_I * parts)(*ns))


def int4_gemm(x: torch.Tensor, mats: Int4Matrices) -> torch.Tensor:
    """x [M, K] @ [W_0; W_1; ...]^T: activations quantized to int8 per 32 values; [M, sum of N]."""
    x = x.contiguous()
    m = x.shape[0]
    y = torch.empty(m, mats.n, dtype=x.dtype)
    _library().speclite_int4_gemm(x.data_ptr(), DTYPES[x.dtype], *mats.args, y.data_ptr(), m, mats.k, mats.group,
                                  torch.get_num_threads())
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


class DenseMatrices:
    """One or more contiguous dense weights [N_i, K] of one dtype (fp32, bf16, f16) and one input,
    multiplied in one kernel call (x widened to fp32 once, one thread team for all the columns)."""

    def __init__(self, weights):
        self.weights, self.n, self.k = weights, sum(w.shape[0] for w in weights), weights[0].shape[1]
        parts = len(weights)
        self.args = [ctypes.c_int(parts), (_P * parts)(*(w.data_ptr() for w in weights)), DTYPES[weights[0].dtype],
                     (_I * parts)(*(w.shape[0] for w in weights))]


def dense_gemm(x: torch.Tensor, mats: DenseMatrices) -> torch.Tensor:
    """x [M, K] @ [W_0; W_1; ...]^T in fp32 arithmetic; [M, sum of N] in x's dtype."""
    x = x.contiguous()
    m = x.shape[0]
    y = torch.empty(m, mats.n, dtype=x.dtype)
    _library().speclite_dense_gemm(x.data_ptr(), DTYPES[x.dtype], *mats.args, y.data_ptr(), m, mats.k,
                                   torch.get_num_threads())
    return y


def half_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w^T for one contiguous fp32, bf16 or f16 w [N, K], fp32 arithmetic."""
    return dense_gemm(x, DenseMatrices([w]))


def cached(owner, tensors: list, build):
    """build() kept on module `owner` for these exact tensors (a weight replaced: built again).
    A layer's kernel arguments (pointer arrays, joined biases) are built once, not per call."""
    store = owner.__dict__.setdefault("_speclite_cached", {})
    key = tuple(id(t) for t in tensors)
    found = store.get(key)
    if found is None or any(a is not b for a, b in zip(found[0], tensors)):
        found = store[key] = (list(tensors), build())
    return found[1]


def joined_bias(linears) -> torch.Tensor | None:
    """The linears' biases side by side (zeros for one without), or None if none has one."""
    dtype = next((m.bias.dtype for m in linears if m.bias is not None), None)
    if dtype is None:
        return None
    return torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features, dtype=dtype) for m in linears])


@functools.cache
def _library():
    return cpu_build.load("avx2", "gemm_avx2.cpp", FLAGS, {
        "speclite_int4_gemm": [_P, _I, _I, _PP, _PP, _PP, _IP, _P, _I, _I, _I, _I],
        "speclite_int8_gemm": [_P, _I, _P, _P, _P, _I, _I, _I, _I],
        "speclite_dense_gemm": [_P, _I, _I, _PP, _I, _IP, _P, _I, _I, _I],
    })
