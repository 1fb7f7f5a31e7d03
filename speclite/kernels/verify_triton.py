"""Triton rejection sampling: one launch, one program, decides acceptance and samples on the device.

A single program streams the needed target/draft rows (at most three passes over one vocab
row); the host reads back one int64 pair. Same fixed-point sampling as verify.py.
"""

import torch
import triton
import triton.language as tl

from .verify import MASS_ONE, UNIFORM_BITS, UNIFORM_ONE, _as_uniform

_BLOCK_V = 2048


@triton.jit
def _verify_rejection_kernel(tok_ptr, q_ptr, p_ptr, u_ptr, ru_ptr, out_ptr, k, V, stride_q, stride_p,
                             HAS_DRAFT: tl.constexpr, K_BLOCK: tl.constexpr, BLOCK_V: tl.constexpr,
                             MASS_ONE: tl.constexpr, UNIFORM_ONE: tl.constexpr, UNIFORM_BITS: tl.constexpr):
    i = tl.arange(0, K_BLOCK)
    in_k = i < k
    tok = tl.load(tok_ptr + i, mask=in_k, other=0)
    p = tl.load(p_ptr + i * stride_p + tok, mask=in_k, other=0.0).to(tl.float32)
    if HAS_DRAFT:
        q = tl.load(q_ptr + i * stride_q + tok, mask=in_k, other=1.0).to(tl.float32)
    else:
        q = tl.full([K_BLOCK], 1.0, tl.float32)
    u = tl.load(u_ptr + i, mask=in_k, other=0.0).to(tl.float32)
    rejected = in_k & ~(u * q < p)
    n = tl.min(tl.where(rejected, i, k), axis=0)
    resample = n < k
    n_tok = tl.sum(tl.where(i == n, tok, 0), axis=0)
    p_row = p_ptr + n * stride_p
    q_row = q_ptr + n * stride_q
    # q row n exists only when a draft was rejected; a zero length masks every load of it
    q_len = tl.where(resample, V, 0)

    # pass 1: total residual mass and total target mass, to choose the distribution
    r_total = tl.zeros([], tl.int64)
    p_total = tl.zeros([], tl.int64)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        pv = tl.load(p_row + offs, mask=offs < V, other=0.0).to(tl.float32)
        if HAS_DRAFT:
            qv = tl.load(q_row + offs, mask=offs < q_len, other=0.0).to(tl.float32)
        else:
            qv = tl.where((offs == n_tok) & resample, 1.0, 0.0)
        r_total += tl.sum((tl.maximum(pv - qv, 0.0) * MASS_ONE).to(tl.int64), axis=0)
        p_total += tl.sum((pv * MASS_ONE).to(tl.int64), axis=0)
    use_residual = resample & (r_total > 0)
    q_len = tl.where(use_residual, V, 0)
    total = tl.where(use_residual, r_total, p_total)
    ru = tl.load(ru_ptr)
    threshold = ((ru * UNIFORM_ONE).to(tl.int64) * total) >> UNIFORM_BITS

    # pass 2: count prefix sums <= threshold (order-free integer arithmetic)
    count = tl.zeros([], tl.int64)
    carry = tl.zeros([], tl.int64)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        pv = tl.load(p_row + offs, mask=offs < V, other=0.0).to(tl.float32)
        if HAS_DRAFT:
            qv = tl.load(q_row + offs, mask=offs < q_len, other=0.0).to(tl.float32)
        else:
            qv = tl.where((offs == n_tok) & use_residual, 1.0, 0.0)
        mass = (tl.maximum(pv - qv, 0.0) * MASS_ONE).to(tl.int64)
        prefix = tl.cumsum(mass, axis=0) + carry
        count += tl.sum(((prefix <= threshold) & (offs < V)).to(tl.int64), axis=0)
        carry += tl.sum(mass, axis=0)
    tl.store(out_ptr, n.to(tl.int64))
    tl.store(out_ptr + 1, tl.minimum(count, V - 1))


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def verify_rejection(draft_tokens, draft_probs, target_probs, uniforms, residual_uniform) -> tuple:
    k = draft_tokens.numel()
    vocab = target_probs.shape[1]
    device = target_probs.device
    target_probs = _rows_contiguous(target_probs)
    draft_probs = _rows_contiguous(draft_probs) if draft_probs is not None else None
    out = torch.empty(2, dtype=torch.int64, device=device)
    tokens = draft_tokens if k else torch.zeros(1, dtype=torch.int64, device=device)  # never read when k == 0
    u = uniforms.float() if k else torch.zeros(1, dtype=torch.float32, device=device)
    has_draft = draft_probs is not None and k > 0  # an empty [0, V] draft may have a null data pointer
    q = draft_probs if has_draft else target_probs
    _verify_rejection_kernel[(1,)](
        tokens, q, target_probs, u, _as_uniform(residual_uniform, device), out, k, vocab, q.stride(0),
        target_probs.stride(0), HAS_DRAFT=has_draft, K_BLOCK=triton.next_power_of_2(max(k, 1)),
        BLOCK_V=_BLOCK_V, MASS_ONE=MASS_ONE, UNIFORM_ONE=UNIFORM_ONE, UNIFORM_BITS=UNIFORM_BITS,
    )
    return out[0], out[1]
