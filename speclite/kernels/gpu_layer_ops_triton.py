"""Triton kernels of gpu_layer_ops: one program a row (a token, or a token's head), so a row's
numbers never depend on the rows beside it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8_block import FP8_MAX, FP8_SCALE_EPS
from .int8 import INT8_SCALE_EPS
from .triton_common import fp8_group_scale, int8_row_scale, to_e4m3, to_int8


@triton.jit
def quantize_out(y, offs, ok, D, q_ptr, s_ptr, row, QUANT: tl.constexpr, GROUP: tl.constexpr, QMAX: tl.constexpr,
                 QEPS: tl.constexpr):
    """A producer's output block y (1-D: fp32 values of the rounded output at columns offs of a row D wide,
    those where ok is set its own) quantized as its consumer GEMM would quantize it: QUANT 1, fp8 per
    GROUP columns (whole groups, consecutive, in the block); QUANT 2, int8 with the row's scale (the
    whole row in the block)."""
    if QUANT == 1:
        groups = tl.reshape(y, (y.shape[0] // GROUP, GROUP))
        at = tl.reshape(offs, (y.shape[0] // GROUP, GROUP))
        mine = tl.reshape(ok, (y.shape[0] // GROUP, GROUP))
        scale = fp8_group_scale(tl.max(tl.abs(groups), axis=1), QMAX, QEPS)
        tl.store(q_ptr + row * D + at, to_e4m3(groups, scale[:, None], QMAX).to(q_ptr.dtype.element_ty), mask=mine)
        first = tl.min(offs, axis=0) // GROUP
        index = first + tl.arange(0, y.shape[0] // GROUP)
        tl.store(s_ptr + row * tl.cdiv(D, GROUP) + index, scale, mask=tl.max(mine.to(tl.int32), axis=1) > 0)
    if QUANT == 2:
        scale = int8_row_scale(tl.max(tl.abs(y), axis=0), QEPS)
        tl.store(q_ptr + row * D + offs, to_int8(y, scale).to(tl.int8), mask=ok)
        tl.store(s_ptr + row, scale)


@triton.jit
def _rms_norm_kernel(x_ptr, d_ptr, w_ptr, sum_ptr, out_ptr, q_ptr, s_ptr, D, eps, BLOCK: tl.constexpr,
                     ADD: tl.constexpr, QUANT: tl.constexpr, GROUP: tl.constexpr, QMAX: tl.constexpr,
                     QEPS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    x = tl.load(x_ptr + row * D + offs, mask=mask, other=0.0)
    if ADD:  # the residual stream first, rounded as torch's add rounds it, and kept
        x = (x.to(tl.float32) + tl.load(d_ptr + row * D + offs, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + row * D + offs, x, mask=mask)
    xf = x.to(tl.float32)
    h = (xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)).to(x.dtype)  # rounded, then scaled: as RMSNorm
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = (w * h.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * D + offs, y, mask=mask)
    quantize_out(y.to(tl.float32), offs, mask, D, q_ptr, s_ptr, row, QUANT, GROUP, QMAX, QEPS)


def quant_buffers(rows: int, d: int, quant: tuple | None, device) -> tuple[dict, torch.Tensor | None, torch.Tensor | None]:
    """(quantize_out's constexprs, q, scales) for a producer kernel that also quantizes its [rows, d] output
    for quant = ("fp8", group) or ("int8", None); (QUANT 0, None, None) without."""
    if quant is None:
        return dict(QUANT=0, GROUP=1, QMAX=FP8_MAX, QEPS=FP8_SCALE_EPS), None, None
    kind, group = quant
    if kind == "fp8":
        return (dict(QUANT=1, GROUP=group, QMAX=FP8_MAX, QEPS=FP8_SCALE_EPS),
                torch.empty(rows, d, dtype=torch.float8_e4m3fn, device=device),
                torch.empty(rows, triton.cdiv(d, group), dtype=torch.float32, device=device))
    return (dict(QUANT=2, GROUP=1, QMAX=FP8_MAX, QEPS=INT8_SCALE_EPS),
            torch.empty(rows, d, dtype=torch.int8, device=device), torch.empty(rows, 1, dtype=torch.float32, device=device))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None,
             quant: tuple | None = None):
    """The norm of x, or (x + delta, the norm of that) when delta is given; with quant, the norm's rows
    quantized too, (q, scales) after those."""
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    rows = rows if rows.is_contiguous() else rows.contiguous()
    out = torch.empty(rows.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    total = None if delta is None else torch.empty_like(rows)
    deltas = None if delta is None else delta.reshape(-1, d).contiguous()
    quantizing, q, scales = quant_buffers(rows.shape[0], d, quant, x.device)
    block = max(triton.next_power_of_2(d), quantizing["GROUP"])
    _rms_norm_kernel[(rows.shape[0],)](rows, rows if deltas is None else deltas, weight,
                                       out if total is None else total, out, out if q is None else q,
                                       out if scales is None else scales, d, eps, BLOCK=block,
                                       ADD=delta is not None, **quantizing, num_warps=min(16, max(1, block // 256)))
    normed = out.reshape(*x.shape[:-1], d)
    made = (normed,) if delta is None else (total.reshape(x.shape), normed)
    if quant:
        return made + (q, scales)
    return made[0] if delta is None else made


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, q_ptr, s_ptr, inter, BLOCK: tl.constexpr, QUANT: tl.constexpr,
                     GROUP: tl.constexpr, QMAX: tl.constexpr, QEPS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if QUANT == 2:  # int8: the row's scale needs all of it, so one program walks the row twice
        absmax = tl.zeros([BLOCK], dtype=tl.float32)
        for c0 in range(0, inter, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            y = swiglu(x_ptr, row, cols, inter)
            tl.store(out_ptr + row * inter + cols, y, mask=cols < inter)
            absmax = tl.maximum(absmax, tl.abs(y.to(tl.float32)))
        scale = int8_row_scale(tl.max(absmax, axis=0), QEPS)
        for c0 in range(0, inter, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            q = to_int8(swiglu(x_ptr, row, cols, inter).to(tl.float32), scale)
            tl.store(q_ptr + row * inter + cols, q.to(tl.int8), mask=cols < inter)
        tl.store(s_ptr + row, scale)
    else:
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        y = swiglu(x_ptr, row, cols, inter)
        tl.store(out_ptr + row * inter + cols, y, mask=cols < inter)
        quantize_out(y.to(tl.float32), cols, cols < inter, inter, q_ptr, s_ptr, row, QUANT, GROUP, QMAX, QEPS)


@triton.jit
def swiglu(x_ptr, row, cols, inter):
    """silu(gate) * up at columns cols of row of x = [gate | up], rounded as F.silu(gate) * up rounds."""
    mask = cols < inter
    gate = tl.load(x_ptr + row * 2 * inter + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * 2 * inter + inter + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # rounded, then multiplied
    return (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)


def silu_mul(gate_up: torch.Tensor, quant: tuple | None = None):
    """silu(gate) * up; with quant, (that, q, scales): its rows quantized too."""
    inter = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * inter)
    rows = rows if rows.is_contiguous() else rows.contiguous()
    out = torch.empty(rows.shape[0], inter, dtype=gate_up.dtype, device=gate_up.device)
    quantizing, q, scales = quant_buffers(rows.shape[0], inter, quant, gate_up.device)
    block = max(1024, quantizing["GROUP"])
    grid = (rows.shape[0],) if quantizing["QUANT"] == 2 else (rows.shape[0], triton.cdiv(inter, block))
    _silu_mul_kernel[grid](rows, out, out if q is None else q, out if scales is None else scales, inter, BLOCK=block,
                           **quantizing, num_warps=4)
    made = out.reshape(*gate_up.shape[:-1], inter)
    return (made, q, scales) if quant else made


@triton.jit
def rope_heads(x, xp, c, s, w, wp, eps, first_half, D: tl.constexpr, QK_NORM: tl.constexpr):
    """Heads x [R, BLOCK_D] (xp: each element's RoPE partner, element i +- D/2) with RoPE applied: the sum
    of x * cos and rotate(x) * sin with each product rounded to x's dtype, as the decoder's torch code
    (fp32: the caller rounds the sum); each head RMS-normed by w (wp: its partners) first where QK_NORM,
    rounded where the norm module rounds. c, s, w, wp in fp32."""
    if QK_NORM:
        xf = x.to(tl.float32)
        r = tl.rsqrt(tl.sum(xf * xf, axis=1) / D + eps)[:, None]
        xp = (wp * (xp.to(tl.float32) * r).to(x.dtype).to(tl.float32)).to(x.dtype)
        x = (w * (xf * r).to(x.dtype).to(tl.float32)).to(x.dtype)
    xpf = xp.to(tl.float32)  # negated in float32 (exact): the interpreter keeps bf16 as raw integers
    rot = tl.where(first_half, -xpf, xpf)
    return (x.to(tl.float32) * c).to(x.dtype).to(tl.float32) + (rot * s).to(x.dtype).to(tl.float32)


@triton.jit(do_not_specialize=["start"])
def _rope_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, slots_ptr, start, qn_ptr, kn_ptr, eps,
                       qkv_stride, max_len,
                       H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                       HAS_SLOTS: tl.constexpr, QK_NORM: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK)[None, :]  # one head as a [1, BLOCK] tile, as rope_heads takes heads
    mask = offs < D
    src = qkv_ptr + tok * qkv_stride + head * D
    if HAS_SLOTS:
        slot = tl.load(slots_ptr + tok).to(tl.int64)
    else:
        slot = start + tok
    x = tl.load(src + offs, mask=mask, other=0.0)
    if head >= H + KV:  # a v head: into the cache as it is
        dst = v_ptr + (head - H - KV).to(tl.int64) * max_len * D + slot * D
        tl.store(dst + offs, x.to(v_ptr.dtype.element_ty), mask=mask)
    else:
        # RoPE pairs element i with i +- D/2: rotate(x) = [-x[D/2:], x[:D/2]]
        partner = tl.where(offs < D // 2, offs + D // 2, offs - D // 2)
        xp = tl.load(src + partner, mask=mask, other=0.0)
        if head < H:
            w_row = qn_ptr
        else:
            w_row = kn_ptr
        w = tl.load(w_row + offs, mask=mask & QK_NORM, other=0.0).to(tl.float32)
        wp = tl.load(w_row + partner, mask=mask & QK_NORM, other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + tok * D + offs, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + tok * D + offs, mask=mask, other=0.0).to(tl.float32)
        y = rope_heads(x, xp, c, s, w, wp, eps, offs < D // 2, D, QK_NORM)
        if head < H:
            tl.store(q_ptr + (tok * H + head) * D + offs, y.to(q_ptr.dtype.element_ty), mask=mask)
        else:
            dst = k_ptr + (head - H).to(tl.int64) * max_len * D + slot * D
            tl.store(dst + offs, y.to(k_ptr.dtype.element_ty), mask=mask)


def rope_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor,
               cache_v: torch.Tensor, start: int | torch.Tensor, heads: int, kv_heads: int, qk_norm: tuple) -> torch.Tensor:
    t = qkv.shape[0]
    kv, max_len, d = cache_k.shape
    if qkv.stride(-1) != 1 or not (cache_k.is_contiguous() and cache_v.is_contiguous()):
        raise ValueError("rope_cache: qkv rows and both caches must be contiguous")
    cos, sin = cos.reshape(t, d).contiguous(), sin.reshape(t, d).contiguous()
    q = torch.empty(t, heads, d, dtype=qkv.dtype, device=qkv.device)
    has_slots = isinstance(start, torch.Tensor)
    (q_norm, k_norm), eps = qk_norm if qk_norm else ((qkv, qkv), 0.0)  # unread without QK_NORM
    _rope_cache_kernel[(t, heads + 2 * kv_heads)](
        qkv, cos, sin, q, cache_k, cache_v, start if has_slots else qkv, 0 if has_slots else start, q_norm, k_norm,
        eps, qkv.stride(0), max_len, H=heads, KV=kv_heads, D=d, BLOCK=triton.next_power_of_2(d),
        HAS_SLOTS=has_slots, QK_NORM=bool(qk_norm), num_warps=1)
    return q


@triton.jit
def _static_mask_kernel(slots_ptr, pos_ptr, tree_ptr, out_ptr, T, span, window,
                        BLOCK: tl.constexpr, HAS_WINDOW: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_span = cols < span
    first = tl.load(slots_ptr)
    rel = cols - first
    inside = (rel >= 0) & (rel < T)
    at = tl.minimum(tl.maximum(rel, 0), T - 1)
    seen = (rel < 0) | ((tl.load(tree_ptr + row * T + at, mask=in_span, other=0) != 0) & inside)
    if HAS_WINDOW:
        k_pos = tl.where(inside, tl.load(pos_ptr + at, mask=in_span, other=0), cols)  # other keys: position = slot
        seen = seen & (k_pos > tl.load(pos_ptr + row) - window)
    tl.store(out_ptr + row * span + cols, seen.to(tl.int8), mask=in_span)


def static_mask(slots: torch.Tensor, pos: torch.Tensor, tree_mask: torch.Tensor, span: int,
                window: int | None) -> torch.Tensor:
    t = tree_mask.shape[0]
    out = torch.empty(t, span, dtype=torch.bool, device=slots.device)
    block = min(1024, triton.next_power_of_2(span))
    _static_mask_kernel[(t, triton.cdiv(span, block))](
        slots, pos, tree_mask.contiguous().view(torch.int8), out.view(torch.int8), t, span,
        0 if window is None else window, BLOCK=block, HAS_WINDOW=window is not None, num_warps=4)
    return out
