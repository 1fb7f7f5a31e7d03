"""Attention of decode and verification rows over the KV cache in one Triton kernel.

torch's scaled_dot_product_attention takes its math backend wherever a mask meets grouped KV heads
(every CUDA-graph step, every verification): a dozen kernels a layer, the scores of every key of
the graph's span materialised; and its flash backend, which one-row steps took, sums in another
order, so a row verified beside others was not the row decoded alone. Here one program takes one
query row and the query heads of one KV head, over one chunk of CHUNK keys of the cache, keys in
blocks at fixed slots: a row's numbers depend on its own query and the keys it sees alone (a block
of keys it does not see adds exact zeros), whatever rows share the call or how far the cache runs.
A row whose keys span several chunks is summed by the last of its chunks' programs to finish
(triton_common.store_split's count), chunk by chunk in order, so chunks beyond those a row sees add
exact zeros there too.

A row sees the keys before the first new slot, then the new ones its mask row allows, or causally
(key slot <= its own slot) without a mask; no key at or past first + T is ever read, so a CUDA
graph's span costs nothing past the sequence.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import dot_precision, tile_counts

CHUNK = 256  # keys a program takes: a fixed grid of the cache's slots, whatever the call
BLOCK_N = 64
LOG2E = 1.4426950408889634  # the kernel's exponentials are exp2: the scores come scaled by it


@triton.jit(do_not_specialize=["first"])
def _attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, slots_ptr, first, out_ptr, part_ptr, stat_ptr, count_ptr,
                      T, max_len, mask_width, chunks_max, scale,
                      H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
                      HAS_SLOTS: tl.constexpr, HAS_MASK: tl.constexpr, DOT_PRECISION: tl.constexpr):
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
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        rows = (row * H + heads).to(tl.int64)
        q = tl.load(q_ptr + rows[:, None] * D + offs_d[None, :], mask=head_ok[:, None] & d_ok[None, :], other=0.0)
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
            if HAS_MASK:
                seen = exists & (tl.load(mask_ptr + row * mask_width + keys, mask=exists, other=0) != 0)
            else:
                seen = exists & (keys <= first + row)
            kv_ok = exists[:, None] & d_ok[None, :]
            k = tl.load(k_base + keys[:, None] * D + offs_d[None, :], mask=kv_ok, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            s = tl.where(seen[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_base + keys[:, None] * D + offs_d[None, :], mask=kv_ok, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        out_rows = out_ptr + rows[:, None] * D + offs_d[None, :]
        out_ok = head_ok[:, None] & d_ok[None, :]
        if chunks == 1:
            tl.store(out_rows, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=out_ok)
        else:
            at = rows * chunks_max + chunk
            tl.store(part_ptr + at[:, None] * D + offs_d[None, :], acc, mask=out_ok)
            tl.store(stat_ptr + at * 2, m_i, mask=head_ok)
            tl.store(stat_ptr + at * 2 + 1, l_i, mask=head_ok)
            tl.debug_barrier()  # every thread's part stored before the count is raised
            count = count_ptr + row * KV + kv
            if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == chunks - 1:
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
                    total += scale_c[:, None] * tl.load(part_ptr + at[:, None] * D + offs_d[None, :], mask=out_ok,
                                                        other=0.0, cache_modifier=".cg")
                tl.store(out_rows, (total / weight[:, None]).to(out_ptr.dtype.element_ty), mask=out_ok)
                tl.atomic_xchg(count, 0, sem="relaxed", scope="gpu")


def attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, start: int | torch.Tensor,
              mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for q [T, H, D] (the new rows, at cache slots start..start + T - 1, their
    keys and values already in the caches [KV, max_len, D]) -> [T, H, D]. start: an int, or the slots
    tensor of a CUDA-graph step (its first element read on the device). mask [T, >= start + T] bool:
    which keys each row sees; None: causal."""
    t, heads, d = q.shape
    kv, max_len, _ = cache_k.shape
    if not (q.is_contiguous() and cache_k.is_contiguous() and cache_v.is_contiguous()):
        raise ValueError("attention: q and both caches must be contiguous")
    has_slots = isinstance(start, torch.Tensor)
    if mask is not None and (mask.shape[0] != t or (not has_slots and mask.shape[-1] < start + t)):
        raise ValueError(f"attention: a mask of {t} rows over at least the {start} + {t} keys, got {list(mask.shape)}")
    # The most keys a row can see: the mask's width (a CUDA graph's span), else the cache so far.
    width = mask.shape[-1] if mask is not None else (max_len if has_slots else start + t)
    chunks_max = triton.cdiv(min(width, max_len), CHUNK)
    out = torch.empty_like(q)
    group = heads // kv
    if chunks_max > 1:
        parts = torch.empty(t * heads * chunks_max * d, dtype=torch.float32, device=q.device)
        stats = torch.empty(t * heads * chunks_max * 2, dtype=torch.float32, device=q.device)
    else:
        parts = stats = out  # never touched: every row sees one chunk
    masks = None if mask is None else mask.contiguous().view(torch.int8)
    _attention_kernel[(t, kv, chunks_max)](
        q, cache_k, cache_v, q if masks is None else masks, start if has_slots else q, 0 if has_slots else start,
        out, parts, stats, tile_counts(q.device, t * kv), t, max_len, 0 if mask is None else mask.shape[-1],
        chunks_max, d ** -0.5 * LOG2E, H=heads, KV=kv, D=d, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=BLOCK_N, CHUNK=CHUNK, HAS_SLOTS=has_slots,
        HAS_MASK=mask is not None, DOT_PRECISION=dot_precision(q.dtype), num_warps=4)
    return out
