"""Hybrid drafting under sampling: output follows the target's exact warped distributions with each
model part, and the verifier sees the model's q rows followed by one-hot rows for the n-gram drafts."""

import pytest
import torch

from eagle3_heads import save_head
from mtp_modules import add_module
from speclite.model import load_model
from speclite.sampling import SamplingParams, make_generator
from speclite.speculate import RequestContext
from speclite.speculate.draft_model import DraftModelProposer
from speclite.speculate.eagle3 import Eagle3Proposer, load_draft as load_head
from speclite.speculate.hybrid import HybridProposer
from speclite.speculate.mtp import MTPProposer, load_draft as load_module
from speclite.speculate.prompt_lookup import PromptLookupProposer
from speclite.speculate.suffix import SuffixProposer
from test_sampling_exact import (PROMPT, SETTINGS, VOCAB, chi_square_pvalue, exact_distributions, one_thread,
                                 sampled_counts, save_small_target)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """test_sampling_exact's target (4 layers) with an MTP module, a noisy copy as draft model and an
    EAGLE-3 head: model parts that agree with it sometimes."""
    root = tmp_path_factory.mktemp("hybrid-small")
    model = save_small_target(root / "target", layers=4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.7 * p.std() * torch.randn_like(p))
    model.save_pretrained(root / "draft")
    add_module(root / "target", "deepseek", seed=5, scale=3.0)
    save_head(root / "head", "speculators", 32, VOCAB, draft_vocab=6, seed=5, scale=3.0)
    with one_thread():
        yield root, load_model(root / "target", device="cpu")


def model_part(kind, root, target):
    embed, vocab = target.model.embed_tokens, target.args.vocab_size
    if kind == "vanilla":
        return DraftModelProposer(load_model(root / "draft", device="cpu"), 16, vocab)
    if kind == "eagle3":
        return Eagle3Proposer(load_head(root / "head", target), embed, 16, vocab)
    return MTPProposer(load_module(None, target), embed, 16, vocab)


def hybrid(kind, root, target, steps):
    return HybridProposer(model_part(kind, root, target), {"lookup": PromptLookupProposer(), "suffix": SuffixProposer(
        VOCAB)}, steps, kind)


# One warping per model part (each run is 2500 requests); k 2 (of 3 tokens: one iteration with two
# drafts, then one with one): the model's draft, then an n-gram one.
@pytest.mark.parametrize("kind, name", [("vanilla", "temperature 1"), ("eagle3", "top-k 3, temperature 0.8"),
                                        ("mtp", "top-p 0.7")])
def test_sampling_matches_target_distribution(small, kind, name):
    root, target = small
    params = SETTINGS[name]
    proposer = hybrid(kind, root, target, 1)
    parts, propose = {}, proposer.propose

    def counting(k):
        proposal = propose(k)
        for part, count in proposal.parts:
            parts[part] = parts.get(part, 0) + count
        return proposal

    proposer.propose = counting
    pairs, thirds, accepted, proposed = sampled_counts(target, proposer, params, k=2)
    assert parts[kind] > 0 and parts["lookup"] + parts["suffix"] > 0, parts  # mixed chains were verified
    assert 0.05 < accepted / proposed < 0.95, accepted / proposed
    joint, third = exact_distributions(target, params)
    assert chi_square_pvalue(pairs, joint) > 1e-4
    assert chi_square_pvalue(thirds, third) > 1e-4


def test_verifier_rows_are_model_q_then_one_hot(small):
    """A proposal's probs: the model part's own warped distributions, then one-hot rows."""
    root, target = small
    prompt = PROMPT * 3  # repetitive: prompt lookup fills after the model's two drafts
    ctx = RequestContext(SamplingParams(temperature=1.0, seed=3), make_generator(3, torch.device("cpu")),
                         torch.device("cpu"))
    proposer = hybrid("vanilla", root, target, 2)
    proposer.begin(prompt, ctx)
    with torch.inference_mode():
        proposal = proposer.propose(5)
        again = DraftModelProposer(load_model(root / "draft", device="cpu"), 16, VOCAB)
        again.begin(prompt, RequestContext(ctx.params, make_generator(3, torch.device("cpu")), ctx.device))
        model = again.propose(2)
    assert proposal.parts[0] == ("vanilla", 2) and proposal.tokens[:2] == model.tokens
    assert torch.equal(proposal.probs[:2], model.probs)
    filled = proposal.tokens[2:]
    assert filled and proposal.probs.shape == (len(proposal.tokens), VOCAB)
    assert torch.equal(proposal.probs[2:], torch.nn.functional.one_hot(torch.tensor(filled), VOCAB).to(model.probs.dtype))
