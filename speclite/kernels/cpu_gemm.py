"""speclite's CPU matrix products (kernels/cpu/gemm.h): int4, int8 (W8A8) and fp32/bf16/f16.

One C call per matmul, any number of rows (decode, k+1 verification and prefill take the same
kernel), threads from torch.get_num_threads(). Weights are repacked once at load (pack_int4,
pack_int8, pack_dense; one layout for every ISA path); activations arrive in fp32, bf16 or f16 and the output
has their dtype. A row's result does not depend on the other rows of the call (see the source),
which keeps speculative decoding bit-identical to plain decoding; only a drafter's products
(drafting(): proposals, checked by the target) may take faster tiles that do not keep it. Built by
cpu_build for the process's ISA path (AVX2, or AVX-512 with VNNI). `available()` is False without such a
CPU or a compiler, or with SPECLITE_CPU_KERNELS=0: callers keep torch's ops.
"""

from __future__ import annotations

import ctypes
import mmap
import operator

import torch

from speclite.kernels import cpu_build

DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
DENSE, INT4, INT8 = 0, 1, 2  # struct Matrices' kinds
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
    kernel's layout (gemm.h, Int4): per 8 columns (N padded with zero columns) and 32-block,
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


def pack_int8(w: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] into the kernel's layout (gemm.h, Int8): per 8 columns (N padded with zero
    columns) and 32-block (K padded with zeros), the 8 columns' 32 values in turn; [N / 8, K / 32 * 256]."""
    n, k = w.shape
    w = torch.nn.functional.pad(w.to(torch.int8), (0, -k % 32, 0, -n % 8))
    return w.view(w.shape[0] // 8, 8, -1, 32).transpose(1, 2).reshape(w.shape[0] // 8, -1).contiguous()


def pack_dense(w: torch.Tensor) -> torch.Tensor:
    """fp32 / bf16 / f16 [N, K] into the kernel's panels (gemm.h, Dense): 16 columns each (N padded
    with zero columns); fp32 and f16 [N / 16, K, 16], one value of K for the 16 columns at a time;
    bf16 [N / 16, K' / 2, 16, 2] (K' = K rounded up to even with a zero column), each column's pair of
    consecutive values together. A copy in huge pages (_huge_empty): the module keeps its own weight
    for torch's ops."""
    n, k = w.shape
    w = torch.nn.functional.pad(w, (0, 0, 0, -n % 16))
    if w.dtype == torch.bfloat16:
        w = torch.nn.functional.pad(w, (0, k % 2))
        w = w.reshape(-1, 16, w.shape[1] // 2, 2).transpose(1, 2)
    else:
        w = w.reshape(-1, 16, k).transpose(1, 2)
    return _huge_empty(w.shape, w.dtype).copy_(w)


_HUGE_PAGE, _CHUNK = 2 << 20, 32 << 20
_chunk = {"buffer": None, "used": 0}


def _huge_empty(shape, dtype) -> torch.Tensor:
    """An empty CPU tensor in memory advised for transparent huge pages, as model.arena places the
    weights (Linux's default THP mode gives huge pages only to advised memory; the panels of a bf16
    Qwen2.5-0.5B shape in torch's own allocations decoded 3% slower, benchmarks/RESULTS.md). Small
    ones share 32 MB mappings, taken in turn; a mapping lives while any tensor in it does. torch's
    allocator where there is no MADV_HUGEPAGE or no room for a mapping."""
    nbytes = -(-torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size() // 64) * 64
    if not hasattr(mmap, "MADV_HUGEPAGE") or nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    try:
        if nbytes > _CHUNK // 2:
            buffer, start = huge_mapping(nbytes), 0
        else:
            if _chunk["buffer"] is None or _chunk["used"] + nbytes > _CHUNK:
                _chunk.update(buffer=huge_mapping(_CHUNK), used=0)
            buffer, start = _chunk["buffer"], _chunk["used"]
            _chunk["used"] += nbytes
    except OSError:
        return torch.empty(shape, dtype=dtype)
    return buffer[start:start + nbytes].view(dtype)[:torch.Size(shape).numel()].view(shape)


def huge_mapping(nbytes: int) -> torch.Tensor:
    """A new anonymous mapping of at least nbytes (whole huge pages) as uint8, advised MADV_HUGEPAGE
    before its first touch (plain pages on a kernel without THP). OSError where there is no room for
    it (strict overcommit). Needs mmap.MADV_HUGEPAGE (Linux)."""
    mapping = mmap.mmap(-1, -(-nbytes // _HUGE_PAGE) * _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel built without THP
        pass
    return torch.frombuffer(mapping, dtype=torch.uint8)  # keeps the mapping alive while any view does


class Matrices(ctypes.Structure):
    """One or more matrices of one format and one input width (a layer's q, k and v projections; its
    gate and up), multiplied side by side in one kernel call: the activations are quantized or
    widened once and one thread team splits all the columns. Mirrors struct Matrices in
    gemm.h; built once per set of weights (they never move) by the functions below, with an
    fp32 bias (joined_bias) or none."""

    _fields_ = [("kind", _I), ("parts", _I), ("w", _PP), ("scales", _PP), ("zeros", _PP), ("ns", _IP),
                ("n", _I), ("k", _I), ("wdt", _I), ("group", _I), ("bias", ctypes.POINTER(ctypes.c_float)), ("loose", _I)]

    def __init__(self, kind: int, tensors: list[tuple], ns: list[int], k: int, bias: torch.Tensor | None,
                 wdt: int = 0, group: int = 0, loose: bool = False):
        parts = len(ns)
        arrays = [(_P * parts)(*(t[i].data_ptr() if i < len(t) else None for t in tensors)) for i in range(3)]
        super().__init__(kind, parts, *arrays, (_I * parts)(*ns), sum(ns), k, wdt, group,
                         None if bias is None else ctypes.cast(bias.data_ptr(), ctypes.POINTER(ctypes.c_float)), loose)
        self.keep = (tensors, arrays, bias)  # what the pointers point at lives as long as this


def int4_matrices(packs: list[tuple], ns: list[int], k: int, group: int, bias: torch.Tensor | None = None) -> Matrices:
    """pack_int4 results (qweight, scales, zeros) of one input width and group."""
    return Matrices(INT4, packs, ns, k, bias, group=group)


def int8_matrices(weights: list[torch.Tensor], scales: list[torch.Tensor], k: int,
                  bias: torch.Tensor | None = None) -> Matrices:
    """pack_int8 weights and their fp32 per-channel scales [N] (W8A8: activations quantized per row)."""
    return Matrices(INT8, list(zip(weights, scales)), [s.shape[0] for s in scales], k, bias)


def dense_matrices(weights: list[torch.Tensor], bias: torch.Tensor | None = None, loose: bool = False) -> Matrices | None:
    """Dense weights [N_i, K] of one dtype (fp32, bf16, f16), repacked (pack_dense), fp32
    accumulation; None for others."""
    w = weights[0]
    if w.dtype not in DTYPES or not all(v.dtype == w.dtype for v in weights):
        return None
    return Matrices(DENSE, [(pack_dense(v),) for v in weights], [v.shape[0] for v in weights], w.shape[1], bias,
                    wdt=DTYPES[w.dtype], loose=loose)


def matmul(x: torch.Tensor, mats: Matrices) -> torch.Tensor:
    """x [M, K] @ [W_0; W_1; ...]^T (+ the bias, added to the rounded product as torch adds it);
    [M, sum of N] in x's dtype."""
    x = x.contiguous()
    y = torch.empty(x.shape[0], mats.n, dtype=x.dtype)
    _library().speclite_matmul(x.data_ptr(), DTYPES[x.dtype], ctypes.byref(mats), y.data_ptr(), x.shape[0],
                               torch.get_num_threads())
    return y


def needs_grad(x: torch.Tensor, modules=()) -> bool:
    """Whether a gradient must flow through x or the modules' parameters (training a head, scripts/):
    the C++ CPU kernels have no backward, so such calls keep torch's ops."""
    return torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for m in modules for p in m.parameters()))


def module_matrices(x: torch.Tensor, linears: list) -> Matrices | None:
    """The linear modules (one class, one input) as one matmul call on the activations x, built once
    by their class's static cpu_matrices(linears) (None where it has no kernel for them); None also
    where x is not for these kernels or a gradient must flow."""
    build = getattr(type(linears[0]), "cpu_matrices", None)
    if (build is None or x.dim() != 2 or not takes(x) or not all(type(m) is type(linears[0]) for m in linears)
            or needs_grad(x, linears)):
        return None
    return cached(linears[0], linears, lambda: loosened(build(linears), linears))


def loosened(mats: Matrices | None, linears: list) -> Matrices | None:
    """mats marked loose where every one of the linears is a drafter's (drafting())."""
    if mats is not None:
        mats.loose = all(getattr(m, "speclite_drafts", False) for m in linears)
    return mats


def drafting(models, target) -> None:
    """Mark the modules of a proposer's models, except those it shares with the target, as a
    drafter's: their bf16 products may take the AMX bf16 tiles, whose rows do not equal
    their numbers alone (gemm.h, Matrices::loose). Drafts only propose; the target's products, which
    decide every token, stay exact. Read when a module's matrices are built (its first product)."""
    exact = {id(m) for m in target.modules()}
    for model in models:
        for m in model.modules():
            if id(m) not in exact:
                m.speclite_drafts = True


def cached(owner, modules: list, build, deep: bool = False):
    """build() kept on module `owner` while `modules` are the same objects holding the same
    parameters and buffers (deep: every submodule of theirs too, and a submodule replaced anywhere
    counts). Kernel arguments (pointer arrays, joined biases) are built once, not per call; checking
    costs a dict lookup per tensor. One entry per owner and kind of call: a rebuilt one replaces
    the old, which lets go of the old weights."""
    store = owner.__dict__.setdefault("_speclite_cached", {})
    key = (deep, len(modules))
    found = store.get(key)
    # map/is_ keep the per-call check in C: it runs for every layer of every step.
    if (found is None or not all(map(operator.is_, found[0], modules))
            or not all(map(operator.is_, map(dict.get, found[1], found[2]), found[3]))):
        watched = [sub for m in modules for sub in m.modules()] if deep else modules
        held = [(d, name, t) for m in watched for d in (m._modules, m._parameters, m._buffers) for name, t in d.items()]
        dicts, names, tensors = (list(column) for column in zip(*held)) if held else ([], [], [])
        found = store[key] = (list(modules), dicts, names, tensors, build())
    return found[4]


def joined_bias(linears) -> torch.Tensor | None:
    """The linears' biases side by side in fp32 (zeros for one without), or None if none has one."""
    if all(m.bias is None for m in linears):
        return None
    return torch.cat([m.bias.float() if m.bias is not None else torch.zeros(m.out_features) for m in linears])


SIGNATURES = {"speclite_matmul": [_P, _I, _P, _P, _I, _I]}


def _library():
    return cpu_build.load("kernels.cpp", SIGNATURES)
