"""The GPU attention kernel of decode and verification rows (kernels.attention_triton) under Triton's
interpreter: float64's softmax attention within rounding over chains, trees and CUDA-graph spans,
grouped KV heads and head dims off a power of two, keys past several chunks; no key past the new
rows ever read; and a row's numbers those it has alone, bit for bit, whatever rows share the call
and however the step is launched. tests/test_cuda.py runs it compiled. (The interpreter's bf16 dot
is wrong: fp16 and fp32 here.)"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (speclite.kernels imports it lazily)

import pytest
import torch

pytest.importorskip("triton")

from speclite.kernels import attention_triton, triton_common  # noqa: E402

CACHE = 1100  # slots: room for keys past four chunks


def case(heads, kv, dim, t, first, dtype, seed):
    """q [t, heads, dim] and caches whose slots past the new rows hold NaN (read once, it spreads)."""
    gen = torch.Generator().manual_seed(seed)
    cache_k, cache_v = (torch.randn(2, kv, CACHE, dim, generator=gen) * 2).to(dtype)
    cache_k[:, first + t:] = float("nan")
    cache_v[:, first + t:] = float("nan")
    q = (torch.randn(t, heads, dim, generator=gen) * 2).to(dtype)
    return q, cache_k, cache_v


def exact(q, cache_k, cache_v, first, seen):
    """float64 softmax(q k^T / sqrt(D)) v, seen [T, first + T] the keys each row attends."""
    t, heads, dim = q.shape
    end, group = first + t, heads // cache_k.shape[0]
    keys = cache_k[:, :end].double().repeat_interleave(group, 0)
    values = cache_v[:, :end].double().repeat_interleave(group, 0)
    scores = torch.einsum("thd,hnd->htn", q.double(), keys) / dim ** 0.5
    weights = scores.masked_fill(~seen[None, :, :end], float("-inf")).softmax(-1)
    return torch.einsum("htn,hnd->thd", weights, values)


def causal(first, t):
    return torch.arange(first + t)[None, :] <= torch.arange(first, first + t)[:, None]


def tree_mask(first, t, seed):
    """The keys before the new rows, then a random set of the new ones, each row seeing itself."""
    gen = torch.Generator().manual_seed(seed)
    tree = (torch.rand(t, t, generator=gen) < 0.5) | torch.eye(t, dtype=torch.bool)
    return torch.cat([torch.ones(t, first, dtype=torch.bool), tree], dim=1)


def tolerance(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-3, "atol": 2e-3}


SHAPES = [  # heads, kv heads, head dim, new rows, first new slot
    (4, 2, 16, 1, 5),  # a decode step
    (7, 1, 64, 5, 37),  # a verification, seven query heads a KV head
    (4, 4, 80, 3, 300),  # no grouping, a head narrower than its block, two chunks
    (14, 2, 64, 9, 1000),  # four chunks, the last one past a chunk boundary
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv,dim,t,first", SHAPES)
def test_causal_rows_are_float64s_and_stand_alone(dtype, heads, kv, dim, t, first):
    q, cache_k, cache_v = case(heads, kv, dim, t, first, dtype, seed=t * first + dim)
    out = attention_triton.attention(q, cache_k, cache_v, first, None)
    assert out.dtype == dtype and out.shape == q.shape and not out.isnan().any()
    torch.testing.assert_close(out.double(), exact(q, cache_k, cache_v, first, causal(first, t)), **tolerance(dtype))
    # Each row as a one-row decode step at its slot: the same bits.
    alone = torch.cat([attention_triton.attention(q[i:i + 1].contiguous(), cache_k, cache_v, first + i, None)
                       for i in range(t)])
    assert torch.equal(alone, out)
    # The same causal rule given as a mask.
    assert torch.equal(attention_triton.attention(q, cache_k, cache_v, first, causal(first, t)), out)
    assert not triton_common._tile_counts[q.device].any()  # every chunk count back to zero


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv,dim,t,first", SHAPES[1:])
def test_trees_and_cuda_graph_spans_are_float64s(dtype, heads, kv, dim, t, first):
    """A tree's rows see their ancestors among the new rows; a CUDA-graph step gives its slots as a
    tensor and its mask as wide as its span: the same bits as the step launched with an int."""
    q, cache_k, cache_v = case(heads, kv, dim, t, first, dtype, seed=first + 3)
    seen = tree_mask(first, t, seed=t)
    out = attention_triton.attention(q, cache_k, cache_v, first, seen)
    torch.testing.assert_close(out.double(), exact(q, cache_k, cache_v, first, seen), **tolerance(dtype))
    span = 1 << (first + t).bit_length()  # past the sequence, as forward_static's spans
    wide = torch.cat([seen, torch.zeros(t, span - first - t, dtype=torch.bool)], dim=1)
    assert torch.equal(attention_triton.attention(q, cache_k, cache_v, torch.arange(first, first + t), wide), out)


def test_a_sliding_window_leaves_whole_chunks_unseen():
    """Rows that see only the last keys (a sliding window's mask): the chunks they skip add nothing."""
    first, t, window = 700, 3, 100
    q, cache_k, cache_v = case(4, 2, 64, t, first, torch.float32, seed=9)
    key_pos, q_pos = torch.arange(first + t), torch.arange(first, first + t)
    seen = causal(first, t) & (key_pos[None, :] > q_pos[:, None] - window)
    out = attention_triton.attention(q, cache_k, cache_v, first, seen)
    torch.testing.assert_close(out.double(), exact(q, cache_k, cache_v, first, seen), **tolerance(torch.float32))


def test_a_mask_narrower_than_the_keys_is_refused():
    q, cache_k, cache_v = case(4, 2, 16, 3, 20, torch.float32, seed=1)
    with pytest.raises(ValueError, match="mask of 3 rows"):
        attention_triton.attention(q, cache_k, cache_v, 20, torch.ones(3, 22, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask of 3 rows"):
        attention_triton.attention(q, cache_k, cache_v, 20, torch.ones(2, 23, dtype=torch.bool))
