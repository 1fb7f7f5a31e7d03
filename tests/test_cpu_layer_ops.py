"""speclite's CPU layer ops (RMSNorm, SwiGLU, q/k norms + RoPE + cache write + attention) on every ISA
path of the machine against float64 torch math, rows independent of the batch, and keys a row does
not see changing nothing."""

from __future__ import annotations

import pytest
import torch

from speclite.kernels import cpu_layer_ops

needs_kernels = pytest.mark.skipif(not cpu_layer_ops.available(), reason="no AVX2 CPU or no C++ compiler here")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def rel_err(y, reference):
    return ((y.double() - reference).abs().max() / reference.abs().max()).item()


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, -1])
def test_cat_equals_torch_cat(isa, dtype, dim):
    # Prompt-sized states past torch's parallel grain, an empty part, a column slice (not contiguous)
    # and parts of different widths (or heights): torch.cat's tensor, value for value.
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(150, 256, generator=g).to(dtype), torch.randn(150, 300, generator=g).to(dtype)
    parts = [a, b[:, :256], a[:0]] if dim == 0 else [a, b[:, 5:], a[:, :3]]
    out = cpu_layer_ops.cat(parts, dim)
    assert out.dtype == dtype and torch.equal(out, torch.cat(parts, dim))


@needs_kernels
@pytest.mark.parametrize("table,dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                         (torch.float16, torch.float16), (torch.bfloat16, torch.float32),
                                         (torch.float16, torch.float32)])
def test_embed_equals_the_tables_rows(isa, table, dtype):
    # A prefill's rows (past torch's 32768-value grain, where its own copy goes parallel), an odd
    # width, repeated and extreme ids: the rows as stored, or a 16-bit table's widened.
    g = torch.Generator().manual_seed(4)
    weights = (torch.randn(1000, 131, generator=g) * 3).to(table)
    ids = torch.cat([torch.tensor([0, 999, 5, 5]), torch.randint(0, 1000, (300,), generator=g)])
    out = cpu_layer_ops.embed(weights, ids, dtype)
    assert out.dtype == dtype and torch.equal(out, torch.nn.functional.embedding(ids, weights).to(dtype))


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,h", [(1, 896), (5, 37), (3, 64)])
def test_rms_norm_equals_float64_math(isa, m, h, dtype):
    torch.manual_seed(m * h)
    x, w = torch.randn(m, h).to(dtype), (torch.rand(h) + 0.5).to(dtype)
    ref = w.double() * (x.double() / (x.double().pow(2).mean(-1, keepdim=True) + 1e-6).sqrt())
    y = cpu_layer_ops.rms_norm(x, w, 1e-6)
    assert y.dtype == dtype and rel_err(y, ref) < (1e-5 if dtype == torch.float32 else 1e-2)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_equals_float64_math(isa, dtype):
    torch.manual_seed(1)
    gate_up = (torch.randn(4, 2 * 75) * 3).to(dtype)
    g, u = gate_up.double().chunk(2, dim=-1)
    y = cpu_layer_ops.swiglu(gate_up)
    assert y.shape == (4, 75) and rel_err(y, g * torch.sigmoid(g) * u) < (1e-5 if dtype == torch.float32 else 1e-2)


@needs_kernels
def test_swiglu_is_accurate_over_the_whole_float32_range(isa):
    # The vectorized exp: within a few float32 ulp of float64 math from -100 to 100 (odd width:
    # the last columns take the scalar path), tiny values where the true result underflows.
    gate = torch.cat([torch.linspace(-100, 100, 2001), torch.randn(2000) * 0.1]).reshape(1, -1)
    gate_up = torch.cat([gate, torch.ones_like(gate)], dim=-1)
    g = gate.double()
    error = (cpu_layer_ops.swiglu(gate_up).double() - g * torch.sigmoid(g)).abs()
    assert (error <= 1e-6 * (g * torch.sigmoid(g)).abs() + 1e-30).all()


def rope64(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def norm64(x, w, eps=1e-6):
    return w.double() * x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def attention_reference(qkv, cos, sin, cache_k, cache_v, heads, kv_heads, start, mask, qk_norm=None):
    """float64: each head's q/k norm (qk_norm's weights, Qwen3) and RoPE, the new keys/values after the
    cached ones, softmax attention under mask."""
    t, d = qkv.shape[0], cache_k.shape[-1]
    q, k, v = qkv.double().split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k = q.view(t, heads, d), k.view(t, kv_heads, d)
    if qk_norm is not None:
        q, k = norm64(q, qk_norm[0]), norm64(k, qk_norm[1])
    c, s = cos.double()[:, None, :], sin.double()[:, None, :]
    q, k, v = rope64(q, c, s), rope64(k, c, s), v.view(t, kv_heads, d)
    keys = torch.cat([cache_k[:, :start].double(), k.transpose(0, 1)], dim=1)
    values = torch.cat([cache_v[:, :start].double(), v.transpose(0, 1)], dim=1)
    group = heads // kv_heads
    keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
    scores = q.transpose(0, 1) @ keys.transpose(1, 2) / d ** 0.5
    scores = scores.masked_fill(~mask[None, :, : start + t], float("-inf"))
    return (scores.softmax(-1) @ values).transpose(0, 1).reshape(t, heads * d), k, v


def case(dtype, t, start, heads=4, kv_heads=2, d=32, max_len=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g).to(dtype)
    angles = torch.rand(t, d // 2, generator=g) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    cache_k = torch.randn(kv_heads, max_len, d, generator=g).to(dtype)
    cache_v = torch.randn(kv_heads, max_len, d, generator=g).to(dtype)
    return qkv, cos, sin, cache_k, cache_v


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,start,tree", [(1, 0, False), (1, 17, False), (5, 9, False), (6, 3, True), (3, 29, False)])
@pytest.mark.parametrize("d", [32, 12])  # scores are taken 8 keys and 8 values at a time: a tail of both
def test_attention_equals_float64_math_and_writes_the_cache(isa, dtype, t, start, tree, d):
    qkv, cos, sin, cache_k, cache_v = case(dtype, t, start, d=d, seed=t + start)
    end = start + t
    mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
    if tree:  # a token tree: new token i sees the prefix and its ancestors (here: every other one)
        new = torch.tril(torch.ones(t, t, dtype=torch.bool)) & ((torch.arange(t)[:, None] - torch.arange(t)[None, :]) % 2 == 0)
        mask = torch.cat([torch.ones(t, start, dtype=torch.bool), new], dim=1)
    ref, k, v = attention_reference(qkv, cos, sin, cache_k, cache_v, 4, 2, start, mask)
    out = cpu_layer_ops.attention(qkv, cos, sin, cache_k, cache_v, 4, 2, start, end, None if t == 1 else mask)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert out.dtype == dtype and rel_err(out, ref) < tol
    assert rel_err(cache_k[:, start:end], k.transpose(0, 1)) < tol
    assert torch.equal(cache_v[:, start:end], v.transpose(0, 1).to(dtype))


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,start", [(1, 0), (1, 17), (5, 9)])
def test_attention_with_qwen3_qk_norms_equals_float64_math(isa, dtype, t, start):
    qkv, cos, sin, cache_k, cache_v = case(dtype, t, start, seed=3 * t + start)
    qkv = qkv * 4 + 1  # off-centre and large: the norms change the numbers
    g = torch.Generator().manual_seed(t)
    norms = tuple((torch.rand(32, generator=g) + 0.5).to(dtype) for _ in range(2))
    end = start + t
    mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
    ref, k, v = attention_reference(qkv, cos, sin, cache_k, cache_v, 4, 2, start, mask, norms)
    out = cpu_layer_ops.attention(qkv, cos, sin, cache_k, cache_v, 4, 2, start, end, None, norms, 1e-6)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert rel_err(out, ref) < tol
    assert rel_err(cache_k[:, start:end], k.transpose(0, 1)) < tol
    plain_k = cache_k.clone()
    cpu_layer_ops.attention(qkv, cos, sin, plain_k, cache_v.clone(), 4, 2, start, end, None)
    assert rel_err(plain_k[:, start:end], k.transpose(0, 1)) > 10 * tol  # the norms were applied, not skipped


@needs_kernels
@pytest.mark.parametrize("d", [32, 12])
def test_attention_rows_are_independent_and_unseen_keys_change_nothing(isa, d):
    qkv, cos, sin, cache_k, cache_v = case(torch.bfloat16, 6, 10, d=d, seed=7)
    start, t = 10, 6
    causal = torch.arange(start + t)[None, :] <= torch.arange(start, start + t)[:, None]
    batch = cpu_layer_ops.attention(qkv, cos, sin, cache_k.clone(), cache_v.clone(), 4, 2, start, start + t, causal)
    # The static path: the whole cache attended under a mask hiding the slots past each row.
    whole = torch.zeros(t, cache_k.shape[1], dtype=torch.bool)
    whole[:, : start + t] = causal
    static = cpu_layer_ops.attention(qkv, cos, sin, cache_k.clone(), cache_v.clone(), 4, 2, start, cache_k.shape[1], whole)
    assert torch.equal(static, batch)
    k, v = cache_k.clone(), cache_v.clone()
    for i in range(t):  # one token at a time, as plain decoding runs
        alone = cpu_layer_ops.attention(qkv[i:i + 1], cos[i:i + 1], sin[i:i + 1], k, v, 4, 2, start + i, start + i + 1, None)
        assert torch.equal(alone[0], batch[i]), i


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [32, 64, 80, 128])
def test_attention_of_many_causal_queries_equals_each_row_alone(isa, dtype, d):
    # Seven rows of a four-query GQA group: 28 queries a KV head, taken in lanes (W at a time, the
    # rest key by key) without a mask; with the causal mask (the static path) and one row at a time
    # they go key by key. Every way gives the same bits, and the float64 numbers. Over 64 keys: the
    # values' blocks.
    heads, kv_heads, start, t = 8, 2, 90, 7
    qkv, cos, sin, cache_k, cache_v = case(dtype, t, start, heads, kv_heads, d, max_len=128, seed=d)
    end = start + t
    causal = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
    ref, _, _ = attention_reference(qkv, cos, sin, cache_k, cache_v, heads, kv_heads, start, causal)
    k, v = cache_k.clone(), cache_v.clone()
    out = cpu_layer_ops.attention(qkv, cos, sin, k, v, heads, kv_heads, start, end, None)
    assert rel_err(out, ref) < (2e-5 if dtype == torch.float32 else 2e-2)
    static = cpu_layer_ops.attention(qkv, cos, sin, cache_k.clone(), cache_v.clone(), heads, kv_heads, start, end, causal)
    assert torch.equal(static, out)
    for i in range(t):
        alone = cpu_layer_ops.attention(qkv[i:i + 1], cos[i:i + 1], sin[i:i + 1], k, v, heads, kv_heads, start + i,
                                        start + i + 1, None)
        assert torch.equal(alone[0], out[i]), i


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 80, 8, 136, 264])  # whole chunks, a tail, less than one, past 128, past 256 (one row at a time)
@pytest.mark.parametrize("visibility", ["causal", "tree", "window"])
def test_attention_over_a_long_cache_equals_float64_math_row_by_row(isa, dtype, d, visibility):
    # Many blocks of cache slots, three query heads a KV head (pairs of queries and one alone share a
    # block's loads), rows that see the whole prefix, and rows that do not ("window": each row's
    # oldest keys hidden, a different number a row, so a block is whole for some rows only).
    heads, kv_heads, start, t = 6, 2, 150, 5
    qkv, cos, sin, cache_k, cache_v = case(dtype, t, start, heads, kv_heads, d, max_len=200, seed=d + t)
    end = start + t
    mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
    if visibility == "tree":
        new = torch.tril(torch.ones(t, t, dtype=torch.bool)) & ((torch.arange(t)[:, None] - torch.arange(t)[None, :]) % 2 == 0)
        mask = torch.cat([torch.ones(t, start, dtype=torch.bool), new], dim=1)
    if visibility == "window":
        mask &= torch.arange(end)[None, :] >= torch.tensor([3, 40, 0, 71, 17])[:, None]
    ref, _, _ = attention_reference(qkv, cos, sin, cache_k, cache_v, heads, kv_heads, start, mask)
    rows = None if visibility == "causal" else mask
    k, v = cache_k.clone(), cache_v.clone()
    out = cpu_layer_ops.attention(qkv, cos, sin, k, v, heads, kv_heads, start, end, rows)
    assert rel_err(out, ref) < (2e-5 if dtype == torch.float32 else 2e-2)
    for i in range(t):  # each row alone (its own mask row, the batch's keys in the cache) gives its numbers bit for bit
        alone = cpu_layer_ops.attention(qkv[i:i + 1], cos[i:i + 1], sin[i:i + 1], k, v, heads, kv_heads, start + i,
                                        start + i + 1 if rows is None else end, None if rows is None else mask[i:i + 1])
        assert torch.equal(alone[0], out[i]), i
