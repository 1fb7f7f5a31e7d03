"""Rejection sampling reproduces the target's exact distribution (chi-square against exact math).

A small-vocabulary target and a draft that disagrees with it often; three tokens are generated
with k=2 (so the first two go through acceptance at both draft positions and the residual, and
the third is the bonus or a fresh iteration), many times through the real loop. The sampled
joint of the first two and the marginal of the third are compared with the target's exact
distributions, computed directly from its warped next-token probabilities.
"""


import pytest
import torch
from conftest import torch_threads
from transformers import AutoModelForCausalLM, Qwen2Config

from speclite.engine.loop import Request, Speculation, decode
from speclite.sampling import SamplingParams, warp
from speclite.model import load_model
from speclite.speculate import verify
from speclite.speculate.draft_model import DraftModelProposer
from speclite.speculate.schedule import SpecLength

VOCAB, PROMPT, SAMPLES = 8, [1, 5, 2, 7], 2500


def save_small_target(path, layers: int = 1):
    """A VOCAB-token target with a peaked head (seed 11), saved to `path`; returns the HF model.
    Every sampling test draws from this one, so their draft/head settings stay comparable."""
    torch.manual_seed(11)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    model.save_pretrained(path)
    return model


def one_thread():
    """These tiny ops only lose to thread hand-offs, badly so on a shared, busy CPU."""
    return torch_threads(1)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(target, draft): the draft is the target's weights plus heavy noise, so their top tokens
    overlap but often differ."""
    root = tmp_path_factory.mktemp("smallvocab")
    model = save_small_target(root / "target")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.7 * p.std() * torch.randn_like(p))
    model.save_pretrained(root / "draft")
    with one_thread():
        yield load_model(root / "target", device="cpu"), load_model(root / "draft", device="cpu")


def exact_distributions(target, params) -> tuple[torch.Tensor, torch.Tensor]:
    """p(t1, t2) [V, V] and p(t3) [V] of the target's warped distributions, by direct computation."""
    def next_probs(tokens):
        cache = target.new_cache(16)
        return warp(target(torch.tensor(tokens), cache)[-1].double(), params).double()

    with torch.no_grad():
        p1 = next_probs(PROMPT)
        joint = torch.stack([p1[a] * next_probs(PROMPT + [a]) for a in range(VOCAB)])
        third = sum(joint[a, b] * next_probs(PROMPT + [a, b]) for a in range(VOCAB) for b in range(VOCAB)
                    if joint[a, b] > 0)
    return joint, third


def sampled_counts(target, proposer, params, k: int = 2) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Counts of the first two tokens (joint) and the third over SAMPLES seeded requests, speculating
    with `proposer` (k drafts, or a tree of k) under rejection sampling; plus the drafts accepted and proposed."""
    pairs = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    thirds = torch.zeros(VOCAB, dtype=torch.float64)
    cache = target.new_cache(16)
    spec = Speculation(proposer, SpecLength(k), "rejection")
    accepted = proposed = 0
    for i in range(SAMPLES):
        request = Request(PROMPT, SamplingParams(max_new_tokens=3, temperature=params.temperature,
                                                 top_k=params.top_k, top_p=params.top_p, seed=1000 + i))
        with torch.inference_mode():
            run = decode(target, cache, request, spec)
            out = [t for chunk in run for t in chunk]
        stats = run.stats
        pairs[out[0], out[1]] += 1
        thirds[out[2]] += 1
        accepted, proposed = accepted + stats.accepted, proposed + stats.proposed
    return pairs, thirds, accepted, proposed


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test; cells expected below 5 are pooled into one."""
    expected = probs.flatten() * counts.sum()
    observed = counts.flatten()
    if observed[expected == 0].sum() > 0:
        return 0.0  # sampled something the target's distribution rules out
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    stat = (((obs - exp) ** 2) / exp)[keep].sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), stat / 2.0))


SETTINGS = {
    "temperature 1": SamplingParams(temperature=1.0),
    "top-k 3, temperature 0.8": SamplingParams(temperature=0.8, top_k=3),
    "top-p 0.7": SamplingParams(temperature=1.0, top_p=0.7),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_rejection_sampling_matches_target_distribution(models, name):
    target, draft = models
    params = SETTINGS[name]
    pairs, thirds, accepted, proposed = sampled_counts(target, DraftModelProposer(draft, 16, VOCAB), params)
    accept_rate = accepted / proposed
    assert 0.1 < accept_rate < 0.8, accept_rate  # the draft disagrees often, yet not always
    joint, third = exact_distributions(target, params)
    # Seeds are fixed, so this is deterministic; a correct sampler fails each with probability 1e-4.
    assert chi_square_pvalue(pairs, joint) > 1e-4
    assert chi_square_pvalue(thirds, third) > 1e-4


def test_unwarped_target_distribution_is_detected(models, monkeypatch):
    """The test above has power: verification that takes p before warping is rejected by it."""
    target, draft = models
    params = SETTINGS["top-k 3, temperature 0.8"]
    monkeypatch.setattr(verify, "warp", lambda logits, p: torch.softmax(logits.float(), dim=-1))
    pairs, _, _, _ = sampled_counts(target, DraftModelProposer(draft, 16, VOCAB), params)
    assert chi_square_pvalue(pairs, exact_distributions(target, params)[0]) < 1e-6
