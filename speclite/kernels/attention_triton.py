"""Attention of decode and verification rows in one Triton kernel: from the rows' q/k/v projections,
their q/k norms (Qwen3) and RoPE, the new keys and values written to the cache, and the attention
over the cache.

torch's scaled_dot_product_attention takes its math backend wherever a mask meets grouped KV heads
(every CUDA-graph step, every verification): a dozen kernels a layer, the scores of every key of
the graph's span materialised; and its flash backend, which one-row steps took, sums in another
order, so a row verified beside others was not the row decoded alone. Here one program takes one
query row and the query heads of one KV head, over one chunk of CHUNK keys of the cache, keys in
blocks at fixed slots: a row's numbers depend on its own query and the keys it sees alone (a block
of keys it does not see adds exact zeros), whatever rows share the call or how far the cache runs.
A row whose keys span several chunks is summed by the last of its chunks' programs to finish
(triton_common.last_to_arrive), chunk by chunk in order, so chunks beyond those a row sees add
exact zeros there too. The new rows' keys and values are read from qkv by every program that needs
them (normed and turned in a tile at the same slots as from the cache, so the same bits), not from
the cache, so no program waits for the one that writes them there.

A row sees the keys before the first new slot, then the new ones its mask row allows, or causally
(key slot <= its own slot) without a mask; no key at or past first + T is ever read, so a CUDA
graph's span costs nothing past the sequence.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gpu_layer_ops_triton import quant_buffers, quantize_out, rope_heads
from .triton_common import dot_precision, last_to_arrive, reset_count, tile_counts

CHUNK = 256  # keys a program takes: a fixed grid of the cache's slots, whatever the call
BLOCK_N = 64
# Eight warps: turning a block of new keys (four [BLOCK_N, D] fp32 tiles) spilled registers at four on
# Hopper (tests/hopper_compile.py: 255 registers and a 136-536 byte stack; 180-193 and none at eight).
WARPS = 8
LOG2E = 1.4426950408889634  # the kernel's exponentials are exp2: the scores come scaled by it


@triton.jit
def _seen(mask_ptr, row, mask_width, keys, exists, first, HAS_MASK: tl.constexpr):
    """Which of a block's keys (slots; those that exist) the row sees: its mask row's, or causally."""
    if HAS_MASK:
        seen = exists & (tl.load(mask_ptr + row * mask_width + keys, mask=exists, other=0) != 0)
    else:
        seen = exists & (keys <= first + row)
    return seen


@triton.jit
def _attend(q, k, v, seen, m_i, l_i, acc, scale, DOT_PRECISION: tl.constexpr):
    """One block of keys into the running softmax (max m_i, sum l_i) and weighted sum acc of the queries."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
    s = tl.where(seen[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + tl.dot(p.to(v.dtype), v,
                                                                                  input_precision=DOT_PRECISION)


@triton.jit
def _store_out(o, out_rows, ok, heads, offs_d, row, xq_ptr, xs_ptr, H: tl.constexpr, D: tl.constexpr,
               BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr, GROUP: tl.constexpr,
               QMAX: tl.constexpr, QEPS: tl.constexpr):
    """A row's heads [BLOCK_G, D] of output, rounded to the output's dtype; with QUANT, also quantized for
    o_proj's FP8 GEMM (per GROUP columns of the row's H * D, GROUP dividing D: whole groups here)."""
    o = o.to(out_rows.dtype.element_ty)
    tl.store(out_rows, o, mask=ok)
    if QUANT:
        cols = heads[:, None] * D + offs_d
        flat: tl.constexpr = BLOCK_G * BLOCK_D
        quantize_out(tl.reshape(o.to(tl.float32), (flat,)), tl.reshape(cols, (flat,)), tl.reshape(ok, (flat,)),
                     H * D, xq_ptr, xs_ptr, row, QUANT, GROUP, QMAX, QEPS)


@triton.jit(do_not_specialize=["first"])
def _attention_kernel(qkv_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, eps, k_ptr, v_ptr, mask_ptr, slots_ptr, first,
                      out_ptr, xq_ptr, xs_ptr, part_ptr, stat_ptr, count_ptr, T, qkv_stride, max_len, mask_width,
                      chunks_max, scale,
                      H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, HAS_SLOTS: tl.constexpr,
                      HAS_MASK: tl.constexpr, QK_NORM: tl.constexpr, DOT_PRECISION: tl.constexpr,
                      QUANT: tl.constexpr, GROUP: tl.constexpr, QMAX: tl.constexpr, QEPS: tl.constexpr):
    row = tl.program_id(0)
    kv = tl.program_id(1)
    chunk = tl.program_id(2)
    if HAS_SLOTS:  # a CUDA-graph step: the first new slot is on the device
        first = tl.load(slots_ptr).to(tl.int32)
    end = first + T  # keys [0, end) exist: the cache before the new rows, and the new rows
    chunks = tl.cdiv(end, CHUNK)
    if chunk < chunks:
        group: tl.constexpr = H // KV
        g = tl.arange(0, BLOCK_G)
        heads = kv * group + g
        head_ok = g < group
        offs_d = tl.arange(0, BLOCK_D)[None, :]
        d_ok = offs_d < D
        partner = tl.where(offs_d < D // 2, offs_d + D // 2, offs_d - D // 2)  # RoPE's: element i +- D/2
        first_half = offs_d < D // 2
        q_norm = tl.load(qn_ptr + offs_d, mask=d_ok & QK_NORM, other=0.0).to(tl.float32)
        q_norm_p = tl.load(qn_ptr + partner, mask=d_ok & QK_NORM, other=0.0).to(tl.float32)
        k_norm = tl.load(kn_ptr + offs_d, mask=d_ok & QK_NORM, other=0.0).to(tl.float32)
        k_norm_p = tl.load(kn_ptr + partner, mask=d_ok & QK_NORM, other=0.0).to(tl.float32)
        # This row's query heads of KV head kv, normed and turned as the cache's keys are.
        q_at = qkv_ptr + row.to(tl.int64) * qkv_stride + heads[:, None] * D
        q_ok = head_ok[:, None] & d_ok
        q_cos = tl.load(cos_ptr + row * D + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        q_sin = tl.load(sin_ptr + row * D + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        q = rope_heads(tl.load(q_at + offs_d, mask=q_ok, other=0.0), tl.load(q_at + partner, mask=q_ok, other=0.0),
                       q_cos, q_sin, q_norm, q_norm_p, eps, first_half, D, QK_NORM).to(qkv_ptr.dtype.element_ty)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        k_base = k_ptr + kv.to(tl.int64) * max_len * D
        v_base = v_ptr + kv.to(tl.int64) * max_len * D
        lo = chunk * CHUNK
        hi = tl.minimum(lo + CHUNK, end)
        for n0 in range(lo, hi, BLOCK_N):
            keys = n0 + tl.arange(0, BLOCK_N)
            exists = keys < hi
            seen = _seen(mask_ptr, row, mask_width, keys, exists, first, HAS_MASK)
            cached = (exists & (keys < first))[:, None] & d_ok
            k = tl.load(k_base + keys[:, None] * D + offs_d, mask=cached, other=0.0)
            v = tl.load(v_base + keys[:, None] * D + offs_d, mask=cached, other=0.0)
            if n0 + BLOCK_N > first:  # new rows' keys and values, from qkv: no program waits for another's
                fresh = (exists & (keys >= first))[:, None] & d_ok
                j = (keys - first)[:, None]
                src = qkv_ptr + j.to(tl.int64) * qkv_stride
                k_at = src + (H + kv) * D
                k_cos = tl.load(cos_ptr + j * D + offs_d, mask=fresh, other=0.0).to(tl.float32)
                k_sin = tl.load(sin_ptr + j * D + offs_d, mask=fresh, other=0.0).to(tl.float32)
                k_new = rope_heads(tl.load(k_at + offs_d, mask=fresh, other=0.0),
                                   tl.load(k_at + partner, mask=fresh, other=0.0), k_cos, k_sin, k_norm, k_norm_p,
                                   eps, first_half, D, QK_NORM).to(k_ptr.dtype.element_ty)
                v_new = tl.load(src + (H + KV + kv) * D + offs_d, mask=fresh, other=0.0).to(v_ptr.dtype.element_ty)
                if row == 0:  # into the cache, once
                    tl.store(k_base + keys[:, None] * D + offs_d, k_new, mask=fresh)
                    tl.store(v_base + keys[:, None] * D + offs_d, v_new, mask=fresh)
                k = tl.where(fresh, k_new, k)
                v = tl.where(fresh, v_new, v)
            m_i, l_i, acc = _attend(q, k, v, seen, m_i, l_i, acc, scale, DOT_PRECISION)
        rows = (row * H + heads).to(tl.int64)
        out_rows = out_ptr + rows[:, None] * D + offs_d
        if chunks == 1:
            _store_out(acc / l_i[:, None], out_rows, q_ok, heads, offs_d, row, xq_ptr, xs_ptr, H, D, BLOCK_G, BLOCK_D,
                       QUANT, GROUP, QMAX, QEPS)
        else:
            at = rows * chunks_max + chunk
            tl.store(part_ptr + at[:, None] * D + offs_d, acc, mask=q_ok)
            tl.store(stat_ptr + at * 2, m_i, mask=head_ok)
            tl.store(stat_ptr + at * 2 + 1, l_i, mask=head_ok)
            count = count_ptr + row * KV + kv
            if last_to_arrive(count, chunks):
                # The row's chunks in order: the largest score first (a max: any order), then the sums.
                top = tl.full([BLOCK_G], float("-inf"), tl.float32)
                for c in range(chunks):
                    top = tl.maximum(top, tl.load(stat_ptr + (rows * chunks_max + c) * 2, mask=head_ok,
                                                  other=0.0, cache_modifier=".cg"))
                total = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
                weight = tl.zeros([BLOCK_G], tl.float32)
                for c in range(chunks):
                    at = rows * chunks_max + c
                    scale_c = tl.exp2(tl.load(stat_ptr + at * 2, mask=head_ok, other=0.0, cache_modifier=".cg") - top)
                    weight += scale_c * tl.load(stat_ptr + at * 2 + 1, mask=head_ok, other=0.0, cache_modifier=".cg")
                    total += scale_c[:, None] * tl.load(part_ptr + at[:, None] * D + offs_d, mask=q_ok,
                                                        other=0.0, cache_modifier=".cg")
                _store_out(total / weight[:, None], out_rows, q_ok, heads, offs_d, row, xq_ptr, xs_ptr, H, D, BLOCK_G,
                           BLOCK_D, QUANT, GROUP, QMAX, QEPS)
                reset_count(count)


def quantizes(quant: tuple | None, head_dim: int) -> bool:
    """Whether the kernel can quantize its output for o_proj in format quant: FP8 groups inside a head
    (a power of two wide, a whole number of groups); a W8A8 token's scale needs every head's output."""
    return (quant is not None and quant[0] == "fp8" and head_dim & (head_dim - 1) == 0 and head_dim >= 16
            and head_dim % quant[1] == 0)


def attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
              start: int | torch.Tensor, mask: torch.Tensor | None, heads: int, qk_norm: tuple = (),
              quant: tuple | None = None):
    """The new rows' attention from their projections qkv [T, (heads + 2 KV) * D] -> [T, heads, D]: each
    head's q and k RMS-normed where qk_norm = ((q_norm weight, k_norm weight), eps) is given (Qwen3),
    RoPE applied with cos, sin [T, 1, D] (gpu_layer_ops.rope_cache's numbers), the new keys and values
    written to the caches [KV, max_len, D] at slots start..start + T - 1 (start: an int, or a CUDA-graph
    step's slots tensor, its first element read on the device), and softmax(q k^T / sqrt(D)) v over the
    keys each row sees: mask [T, >= start + T] bool, or causal where None. With quant (where `quantizes`),
    (out, q, scales): the output's rows [T, heads * D] also quantized for o_proj."""
    t = qkv.shape[0]
    kv, max_len, d = cache_k.shape
    if qkv.stride(-1) != 1 or not (cache_k.is_contiguous() and cache_v.is_contiguous()):
        raise ValueError("attention: qkv rows and both caches must be contiguous")
    if quant is not None and not quantizes(quant, d):
        raise ValueError(f"attention: cannot quantize its output as {quant} with heads {d} wide")
    has_slots = isinstance(start, torch.Tensor)
    if mask is not None and (mask.shape[0] != t or (not has_slots and mask.shape[-1] < start + t)):
        raise ValueError(f"attention: a mask of {t} rows over at least the {start} + {t} keys, got {list(mask.shape)}")
    # The most keys a row can see: the mask's width (a CUDA graph's span), else the cache so far.
    width = mask.shape[-1] if mask is not None else (max_len if has_slots else start + t)
    chunks_max = triton.cdiv(min(width, max_len), CHUNK)
    out = torch.empty(t, heads, d, dtype=qkv.dtype, device=qkv.device)
    if chunks_max > 1:
        parts = torch.empty(t * heads * chunks_max * d, dtype=torch.float32, device=qkv.device)
        stats = torch.empty(t * heads * chunks_max * 2, dtype=torch.float32, device=qkv.device)
    else:
        parts = stats = out  # never touched: every row sees one chunk
    quantizing, xq, xs = quant_buffers(t, heads * d, quant, qkv.device)
    masks = None if mask is None else mask.contiguous().view(torch.int8)
    cos, sin = cos.reshape(t, d).contiguous(), sin.reshape(t, d).contiguous()
    (q_norm, k_norm), eps = qk_norm if qk_norm else ((qkv, qkv), 0.0)  # unread without QK_NORM
    _attention_kernel[(t, kv, chunks_max)](
        qkv, cos, sin, q_norm, k_norm, eps, cache_k, cache_v, qkv if masks is None else masks,
        start if has_slots else qkv, 0 if has_slots else start, out, out if xq is None else xq,
        out if xs is None else xs, parts, stats, tile_counts(qkv.device, t * kv),
        t, qkv.stride(0), max_len, 0 if mask is None else mask.shape[-1], chunks_max, d ** -0.5 * LOG2E,
        H=heads, KV=kv, D=d, BLOCK_G=max(16, triton.next_power_of_2(heads // kv)),
        BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=BLOCK_N, CHUNK=CHUNK, HAS_SLOTS=has_slots,
        HAS_MASK=mask is not None, QK_NORM=bool(qk_norm), DOT_PRECISION=dot_precision(qkv.dtype), **quantizing,
        num_warps=WARPS)
    return (out, xq, xs) if quant else out
