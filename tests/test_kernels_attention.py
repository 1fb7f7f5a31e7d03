"""The GPU attention kernel of decode and verification rows (kernels.attention_triton) under Triton's
interpreter: from the rows' q/k/v projections, the decoder's torch code (q/k norms, RoPE, the cache
write) followed by float64 softmax attention, within rounding, over chains, trees and CUDA-graph
spans, grouped KV heads and head dims off a power of two, keys past several chunks; the cache
written as that code writes it; no key past the new rows ever read; and a row's numbers those it
has alone, bit for bit, whatever rows share the call and however the step is launched.
tests/test_cuda.py runs it compiled. (The interpreter's bf16 dot is wrong: fp16 and fp32 here.)"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (speclite.kernels imports it lazily)

import pytest
import torch

pytest.importorskip("triton")

from layer_ops_reference import decoders_rope_cache  # noqa: E402

from speclite.kernels import attention_triton, triton_common  # noqa: E402
from speclite.model.decoder import rope_tables  # noqa: E402

CACHE = 800  # slots: room for keys past three chunks


def case(heads, kv, dim, t, first, dtype, seed, qk_norm=False):
    """(qkv, cos, sin, cache_k, cache_v, norms): the new rows' projections, RoPE rows for their positions,
    caches whose slots past the new rows hold NaN (read once, it spreads), the q/k norms if asked."""
    gen = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(t, (heads + 2 * kv) * dim, generator=gen) * 2).to(dtype)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    cos, sin = rope_tables(torch.arange(first, first + t), inv_freq, 1.0, dtype)
    cache_k, cache_v = (torch.randn(2, kv, CACHE, dim, generator=gen) * 2).to(dtype)
    cache_k[:, first + t:] = float("nan")
    cache_v[:, first + t:] = float("nan")
    norms = (((torch.rand(dim, generator=gen) + 0.5).to(dtype), (torch.rand(dim, generator=gen) + 0.5).to(dtype)),
             1e-6) if qk_norm else ()
    return qkv, cos, sin, cache_k, cache_v, norms


def exact(qkv, cos, sin, cache_k, cache_v, first, seen, heads, norms):
    """The decoder's torch code for the q/k norms, RoPE and cache write (on copies of the caches), then
    float64 softmax(q k^T / sqrt(D)) v, seen [T, >= first + T] the keys each row attends: (out, k, v)."""
    t, kv, dim = qkv.shape[0], cache_k.shape[0], cache_k.shape[-1]
    ref_k, ref_v = cache_k.clone(), cache_v.clone()
    q = decoders_rope_cache(qkv, cos, sin, ref_k, ref_v, first, heads, kv, norms)
    end, group = first + t, heads // kv
    keys = ref_k[:, :end].double().repeat_interleave(group, 0)
    values = ref_v[:, :end].double().repeat_interleave(group, 0)
    scores = torch.einsum("thd,hnd->htn", q.double(), keys) / dim ** 0.5
    weights = scores.masked_fill(~seen[None, :, :end], float("-inf")).softmax(-1)
    return torch.einsum("htn,hnd->thd", weights, values), ref_k, ref_v


def causal(first, t):
    return torch.arange(first + t)[None, :] <= torch.arange(first, first + t)[:, None]


def tree_mask(first, t, seed):
    """The keys before the new rows, then a random set of the new ones, each row seeing itself."""
    gen = torch.Generator().manual_seed(seed)
    tree = (torch.rand(t, t, generator=gen) < 0.5) | torch.eye(t, dtype=torch.bool)
    return torch.cat([torch.ones(t, first, dtype=torch.bool), tree], dim=1)


def tolerance(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-3, "atol": 2e-3}


def written(cache_k, cache_v, ref_k, ref_v, dtype, norms):
    """The caches as the decoder's torch code writes them: the same bits, but for the q/k norms' sums."""
    assert torch.equal(cache_v.nan_to_num(7.0), ref_v.nan_to_num(7.0))
    if norms:
        torch.testing.assert_close(cache_k.nan_to_num(7.0), ref_k.nan_to_num(7.0), **tolerance(dtype))
    else:
        assert torch.equal(cache_k.nan_to_num(7.0), ref_k.nan_to_num(7.0))


SHAPES = [  # heads, kv heads, head dim, new rows, first new slot
    (4, 2, 16, 1, 5),  # a decode step
    (7, 1, 64, 5, 37),  # a verification, seven query heads a KV head
    (4, 4, 80, 3, 300),  # no grouping, a head narrower than its block, two chunks
    (14, 2, 64, 9, 700),  # three chunks: the new rows in the last
]


@pytest.mark.parametrize("qk_norm", [False, True], ids=["rope", "qk-norm+rope"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv,dim,t,first", SHAPES)
def test_causal_rows_are_the_decoders_and_stand_alone(qk_norm, dtype, heads, kv, dim, t, first):
    qkv, cos, sin, cache_k, cache_v, norms = case(heads, kv, dim, t, first, dtype, t * first + dim, qk_norm)
    expected, ref_k, ref_v = exact(qkv, cos, sin, cache_k, cache_v, first, causal(first, t), heads, norms)
    fresh_k, fresh_v = cache_k.clone(), cache_v.clone()
    out = attention_triton.attention(qkv, cos, sin, cache_k, cache_v, first, None, heads, norms)
    assert out.dtype == dtype and out.shape == (t, heads, dim) and not out.isnan().any()
    torch.testing.assert_close(out.double(), expected, **tolerance(dtype))
    written(cache_k, cache_v, ref_k, ref_v, dtype, norms)
    # Each row as a one-row decode step at its slot, in turn: the same bits, the same cache.
    alone = torch.cat([attention_triton.attention(qkv[i:i + 1], cos[i:i + 1], sin[i:i + 1], fresh_k, fresh_v,
                                                  first + i, None, heads, norms) for i in range(t)])
    assert torch.equal(alone, out)
    assert torch.equal(fresh_k.nan_to_num(7.0), cache_k.nan_to_num(7.0)) and torch.equal(
        fresh_v.nan_to_num(7.0), cache_v.nan_to_num(7.0))
    # The same causal rule given as a mask.
    again = attention_triton.attention(qkv, cos, sin, cache_k, cache_v, first, causal(first, t), heads, norms)
    assert torch.equal(again, out)
    assert not triton_common._tile_counts[qkv.device].any()  # every chunk count back to zero


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv,dim,t,first", SHAPES[1:])
def test_trees_and_cuda_graph_spans_are_the_decoders(dtype, heads, kv, dim, t, first):
    """A tree's rows see their ancestors among the new rows; a CUDA-graph step gives its slots as a
    tensor and its mask as wide as its span: the same bits as the step launched with an int."""
    qkv, cos, sin, cache_k, cache_v, norms = case(heads, kv, dim, t, first, dtype, first + 3)
    seen = tree_mask(first, t, seed=t)
    expected, ref_k, ref_v = exact(qkv, cos, sin, cache_k, cache_v, first, seen, heads, norms)
    out = attention_triton.attention(qkv, cos, sin, cache_k, cache_v, first, seen, heads)
    torch.testing.assert_close(out.double(), expected, **tolerance(dtype))
    written(cache_k, cache_v, ref_k, ref_v, dtype, norms)
    span = 1 << (first + t).bit_length()  # past the sequence, as forward_static's spans
    wide = torch.cat([seen, torch.zeros(t, span - first - t, dtype=torch.bool)], dim=1)
    slots = torch.arange(first, first + t)
    assert torch.equal(attention_triton.attention(qkv, cos, sin, cache_k, cache_v, slots, wide, heads), out)


def test_a_sliding_window_leaves_whole_chunks_unseen():
    """Rows that see only the last keys (a sliding window's mask): the chunks they skip add nothing."""
    first, t, window = 700, 3, 100
    qkv, cos, sin, cache_k, cache_v, norms = case(4, 2, 64, t, first, torch.float32, seed=9)
    key_pos, q_pos = torch.arange(first + t), torch.arange(first, first + t)
    seen = causal(first, t) & (key_pos[None, :] > q_pos[:, None] - window)
    expected = exact(qkv, cos, sin, cache_k, cache_v, first, seen, 4, norms)[0]
    out = attention_triton.attention(qkv, cos, sin, cache_k, cache_v, first, seen, 4)
    torch.testing.assert_close(out.double(), expected, **tolerance(torch.float32))


def test_a_mask_narrower_than_the_keys_is_refused():
    qkv, cos, sin, cache_k, cache_v, _ = case(4, 2, 16, 3, 20, torch.float32, seed=1)
    with pytest.raises(ValueError, match="mask of 3 rows"):
        attention_triton.attention(qkv, cos, sin, cache_k, cache_v, 20, torch.ones(3, 22, dtype=torch.bool), 4)
    with pytest.raises(ValueError, match="mask of 3 rows"):
        attention_triton.attention(qkv, cos, sin, cache_k, cache_v, 20, torch.ones(2, 23, dtype=torch.bool), 4)


@pytest.mark.parametrize("group", [16, 64])
@pytest.mark.parametrize("first", [37, 600])  # one chunk; three (the last program to finish writes)
def test_the_output_quantized_for_o_proj_is_its_quantizers(group, first):
    """For an FP8 o_proj whose groups lie inside a head, the kernel quantizes its output rows too: the
    values o_proj's own quantizer makes of them, scales and all (7 query heads a KV head: padded lanes
    write nothing); a format it cannot make is refused."""
    from speclite.kernels.fp8_block import per_token_group_quant_fp8_torch

    qkv, cos, sin, cache_k, cache_v, _ = case(14, 2, 64, 5, first, torch.float32, seed=group + first)
    plain = attention_triton.attention(qkv, cos, sin, cache_k.clone(), cache_v.clone(), first, None, 14)
    out, q, scales = attention_triton.attention(qkv, cos, sin, cache_k, cache_v, first, None, 14, (), ("fp8", group))
    assert torch.equal(out, plain)
    expected_q, expected_scales = per_token_group_quant_fp8_torch(out.reshape(5, -1), group)
    assert torch.equal(q.float(), expected_q.float()) and torch.equal(scales, expected_scales)
    assert not attention_triton.quantizes(("fp8", 128), 64) and not attention_triton.quantizes(("int8", None), 64)
    with pytest.raises(ValueError, match="cannot quantize"):
        attention_triton.attention(qkv, cos, sin, cache_k, cache_v, first, None, 14, (), ("int8", None))
