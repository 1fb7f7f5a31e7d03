"""Tree verification by recursive rejection sampling reproduces the target's exact distribution.

A toy world with a 6-token vocabulary: the target's (and the draft's) next-token logits are fixed
random functions of the prefix, so the exact warped joint distribution of the first two emitted
tokens is computable directly. Each iteration drafts a width-2, depth-2 tree from the draft (two
i.i.d. samples per node, so siblings may repeat, or the two most likely distinct tokens as one-hot
drafts), runs the real `verify.rejection` on it, and emits the path plus the next token, until two
tokens are out. Pearson's chi-square compares the sampled joint with the exact one.
"""

import pytest
import torch
from test_sampling_exact import chi_square_pvalue

from speclite.sampling import SamplingParams, sample, uniform, warp
from speclite.speculate import Proposal, verify

VOCAB, SAMPLES = 6, 4000
PARENTS = [-1, -1, 0, 0, 1, 1]  # root -> a, b; a -> aa, ab; b -> ba, bb


def logits_of(prefix: tuple, who: int) -> torch.Tensor:
    """Fixed random logits for (prefix, model): who=0 target, who=1 draft (a distorted target)."""
    gen = torch.Generator().manual_seed(hash((prefix, 0)) % 2**31)
    target = 2.0 * torch.randn(VOCAB, generator=gen, dtype=torch.float64)
    if who == 0:
        return target
    noise = torch.Generator().manual_seed(hash((prefix, 1)) % 2**31)
    return target + 2.5 * torch.randn(VOCAB, generator=noise, dtype=torch.float64)


def draft_tree(prefix: tuple, params, gen, one_hot: bool) -> tuple[Proposal, list[tuple]]:
    """A width-2 depth-2 tree and each row's prefix (row 0 = the committed sequence)."""
    tokens, probs, prefixes = [], [], [prefix]
    for parent in (-1, 0, 1):  # the root's two children, then two under each of them
        at = prefixes[parent + 1]
        q = warp(logits_of(at, 1), params)
        picks = torch.topk(q, 2).indices.tolist() if one_hot else [sample(q, uniform(gen)) for _ in range(2)]
        for t in picks:
            tokens.append(t)
            probs.append(q)
            prefixes.append(at + (t,))
    return Proposal(tokens, None if one_hot else torch.stack(probs), PARENTS), prefixes


def run(params, one_hot: bool) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    for i in range(SAMPLES):
        gen = torch.Generator().manual_seed(5000 + i)
        out: list[int] = []
        while len(out) < 2:
            proposal, prefixes = draft_tree(tuple(out), params, gen, one_hot)
            logits = torch.stack([logits_of(p, 0) for p in prefixes]).float()
            path, token = verify.rejection(proposal, logits, params, gen)
            out += [proposal.tokens[j] for j in path] + [token]
        counts[out[0], out[1]] += 1
    return counts


def exact_joint(params) -> torch.Tensor:
    p1 = warp(logits_of((), 0), params).double()
    return torch.stack([p1[a] * warp(logits_of((a,), 0), params).double() for a in range(VOCAB)])


SETTINGS = {
    "temperature 1": SamplingParams(temperature=1.0),
    "top-k 3, temperature 0.8": SamplingParams(temperature=0.8, top_k=3),
    "top-p 0.7": SamplingParams(temperature=1.0, top_p=0.7),
}


def test_tree_layout_is_what_the_sampler_assumes():
    proposal, prefixes = draft_tree((), SETTINGS["temperature 1"], torch.Generator().manual_seed(0), False)
    a, b, aa, ab, ba, bb = proposal.tokens
    assert prefixes == [(), (a,), (b,), (a, aa), (a, ab), (b, ba), (b, bb)]
    assert proposal.children() == {-1: [0, 1], 0: [2, 3], 1: [4, 5]} and not proposal.is_chain


@pytest.mark.parametrize("one_hot", [False, True], ids=["sampled drafts", "one-hot drafts"])
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_tree_rejection_sampling_matches_target(name, one_hot):
    params = SETTINGS[name]
    counts = run(params, one_hot)
    # A correct sampler fails with probability 1e-4 (seeds are fixed, so the test is deterministic).
    assert chi_square_pvalue(counts, exact_joint(params)) > 1e-4


def test_skipping_the_residual_update_is_detected(monkeypatch):
    """The test has power: trying the second child against the unchanged p is biased."""
    params = SETTINGS["temperature 1"]
    monkeypatch.setattr(verify, "residual", lambda p, q: p)
    assert chi_square_pvalue(run(params, False), exact_joint(params)) < 1e-6
