"""Sampling in the CPU kernels (kernels/cpu/sampling.h): the warp against exact float64 math, the
draw against the fixed-point torch routine, and plain sampled decoding in chunks (the target's chain
drawing its tokens in C) against its steps one by one and against the target's exact distribution."""

from __future__ import annotations

import pytest
import torch
from conftest import decode_all, torch_threads
from test_sampling_exact import PROMPT, SETTINGS, VOCAB, chi_square_pvalue, save_small_target

from speclite import LLM, kernels
from speclite.kernels import cpu_sampling
from speclite.kernels.verify import sample_fixed_point
from speclite.model import Transformer, load_model
from speclite.sampling import SamplingParams, uniform, uniforms

pytestmark = pytest.mark.skipif(not cpu_sampling.takes(torch.zeros(1)), reason="no CPU kernels here")


def exact_warp(logits: torch.Tensor, t: float, top_k: int, top_p: float) -> torch.Tensor:
    """The warp by definition, in float64: logits / t; below the k-th largest out; softmax; under top-p
    the fewest largest (ties: the lower index first) whose mass before the last is below top_p, renormalized."""
    x = logits.double() / t
    if 0 < top_k < x.shape[-1]:
        x = x.masked_fill(x < torch.topk(x, top_k).values[-1], float("-inf"))
    p = torch.softmax(x, -1)
    if top_p < 1:
        order = sorted(range(p.numel()), key=lambda i: (-p[i].item(), i))
        keep, before = [], 0.0
        for i in order:
            if before >= top_p:
                break
            keep.append(i)
            before += p[i].item()
        q = torch.zeros_like(p)
        q[keep] = p[keep]
        p = q / q.sum()
    return p


WARPS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.6, 5, 1.0), (0.9, 0, 0.8), (0.5, 40, 0.6), (1.2, 1, 1.0), (1.0, 0, 0.05)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [7, 1001, 4099])
def test_warp_equals_the_exact_warp(dtype, vocab):
    gen = torch.Generator().manual_seed(vocab)
    for t, top_k, top_p in WARPS:
        logits = (torch.randn(3, vocab, generator=gen) * 4).to(dtype)
        ours = cpu_sampling.warp(logits, t, top_k, top_p)
        assert ours.dtype == torch.float32 and ours.shape == logits.shape
        for row in range(3):
            exact = exact_warp(logits[row], t, top_k, top_p)
            where = (dtype, vocab, t, top_k, top_p, row)
            assert torch.equal(ours[row] > 0, exact > 0), where  # the same tokens kept
            kept = exact > 0
            rel = ((ours[row].double() - exact).abs()[kept] / exact[kept]).max()
            assert rel < 2e-5, (where, rel)


def test_draw_is_the_fixed_point_draw():
    gen = torch.Generator().manual_seed(3)
    for vocab in (1, 5, 1000, 70000):
        for _ in range(20):
            weights = torch.rand(vocab, generator=gen) ** 4
            weights[torch.rand(vocab, generator=gen) < 0.3] = 0  # a residual's zeros
            if torch.rand((), generator=gen) < 0.5:
                weights = weights / weights.sum()
            for u in (torch.rand((), generator=gen), torch.tensor(0.0), torch.tensor(1 - 2.0**-24)):
                mass = (weights * kernels.verify.MASS_ONE).to(torch.int64)
                assert cpu_sampling.draw(weights, float(u)) == int(sample_fixed_point(mass, u)), (vocab, float(u))


def test_uniforms_at_once_are_the_draws_one_by_one():
    a, b = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert torch.equal(torch.stack([uniform(a) for _ in range(300)]), uniforms(b, 300))
    assert torch.equal(uniform(a), uniform(b))  # and the streams go on alike


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampled")
    save_small_target(root / "target")
    with torch_threads(1):
        yield load_model(root / "target", device="cpu")


@pytest.mark.parametrize("quant", [None, "int4"])
def test_plain_sampled_chunks_equal_the_steps_one_by_one(isa, model_dirs, quant, monkeypatch):
    """Past its first step, plain sampled decoding draws whole chunks in one C call: the same tokens
    as the loop's steps one by one (each warped and drawn in Python), for every warp, an EOS
    mid-chunk included."""
    target = LLM(str(model_dirs["qwen2"]), quant=quant).target
    calls, real = [], Transformer.chain

    def counting(self, *args):
        out = real(self, *args)
        calls.append(0 if out is None else len(out[0]))
        return out

    prompt = [5, 9, 2, 77, 31]
    for i, (t, top_k, top_p) in enumerate(WARPS):
        params = SamplingParams(max_new_tokens=40, temperature=t, top_k=top_k, top_p=top_p, seed=i)
        with monkeypatch.context() as m:
            m.setattr(Transformer, "chain", counting)
            ours, _ = decode_all(target, prompt, params)
        assert sum(calls) > 1, calls  # tokens came from C chains
        calls.clear()
        with monkeypatch.context() as m:
            m.setattr(Transformer, "chain", lambda *a: None)
            theirs, _ = decode_all(target, prompt, params)
            eos = {theirs[25]}
            cut, _ = decode_all(target, prompt, params, eos=eos)
        assert ours == theirs and len(ours) == 40, (i, ours, theirs)
        ours_cut, _ = decode_all(target, prompt, params, eos=eos)
        assert ours_cut == cut == theirs[: theirs.index(theirs[25]) + 1]


def test_a_declined_chain_draws_nothing(small):
    cache, gen = small.new_cache(8), torch.Generator().manual_seed(4)
    state = gen.get_state()
    assert small.chain(3, cache, 9, VOCAB, SamplingParams(temperature=1.0), gen) is None  # past the cache
    assert torch.equal(gen.get_state(), state) and cache.length == 0


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_sampled_chunks_follow_the_target_distribution(small, name):
    """The second and third tokens come from one C chain (the first step is the loop's): their joint
    distribution is the target's exact warped one (chi-square against float64 math)."""
    params, samples = SETTINGS[name], 2500
    calls, real = [], Transformer.chain
    counts = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Transformer, "chain", lambda self, *a: calls.append(1) or real(self, *a))
        for i in range(samples):
            request = SamplingParams(max_new_tokens=3, temperature=params.temperature, top_k=params.top_k,
                                     top_p=params.top_p, seed=7000 + i)
            out, _ = decode_all(small, PROMPT, request, cache_len=16)
            counts[out[1], out[2]] += 1
    assert len(calls) == samples
    # The exact joint of tokens 2 and 3, summed over the first.
    with torch.no_grad():
        def probs(tokens):
            return exact_warp(small(torch.tensor(tokens), small.new_cache(16))[-1], params.temperature, params.top_k,
                              params.top_p)

        first = probs(PROMPT)
        joint = sum(first[a] * torch.outer(probs(PROMPT + [a]), torch.ones(VOCAB, dtype=torch.float64))
                    * torch.stack([probs(PROMPT + [a, b]) for b in range(VOCAB)]) for a in range(VOCAB) if first[a] > 0)
    assert chi_square_pvalue(counts, joint) > 1e-4
