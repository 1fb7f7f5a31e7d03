"""Verifiers: given a proposal (a chain or a tree of drafts) and the target's logits at every row
fed in, which drafts stand and which token follows.

Each is a callable (proposal, logits, params, generator) -> (path, next_token): `path` lists the
accepted drafts' indices from the root down (a chain's accepted prefix is [0, 1, ..., a-1]);
logits row 0 belongs to the last committed token, row 1+i to draft i. At temperature 0 every
lossless verifier reduces to greedy verification, which is what each means for a one-hot target.
Chains go through the fused kernels on an accelerator; trees (and greedy chains on the CPU) walk
from the root, trying each node's children in order.
"""

from __future__ import annotations

from typing import Callable

import torch

from speclite import kernels
from speclite.errors import SpecliteError
from speclite.sampling import SamplingParams, pick, row_argmaxes, sample, uniform, warp
from speclite.speculate.base import Proposal

Verifier = Callable[[Proposal, torch.Tensor, SamplingParams, torch.Generator], tuple[list[int], int]]

# Nucleus mass the `topp` verifier accepts drafts from when the request itself sets no top_p.
TOPP_VERIFY_MASS = 0.8
# Medusa's typical acceptance: a draft stands when the target gives it more than
# min(epsilon, delta * exp(-entropy)); the Medusa paper's defaults (posterior_threshold, posterior_alpha).
TYPICAL_EPSILON = 0.09
TYPICAL_DELTA = 0.3  # sqrt(epsilon)


def _read(accepted: torch.Tensor, token: torch.Tensor) -> tuple[list[int], int]:
    """A fused kernel's verdict (0-dim tensors) as (path, next token), in one read from the device."""
    accepted, token = torch.stack([accepted, token]).tolist()
    return list(range(accepted)), token


def _walk(proposal: Proposal, step) -> tuple[list[int], int]:
    """Descend from the committed token: step(node, children) -> the child that stands, or
    (None, the token that follows)."""
    kids = proposal.children()
    path, node = [], -1
    while True:
        child, token = step(node, kids.get(node, []))
        if child is None:
            return path, token
        path.append(child)
        node = child


def greedy(proposal, logits, params, generator) -> tuple[list[int], int]:
    """Accept while a draft equals the target's argmax at its parent (the first such child)."""
    if proposal.is_chain and logits.device.type != "cpu":
        # One fused kernel and one host sync; on the CPU its torch ops cost more than the walk below.
        drafts = torch.tensor(proposal.tokens, dtype=torch.long, device=logits.device)
        return _read(*kernels.verify_greedy(drafts, logits))
    best = row_argmaxes(logits)

    def step(node, children):
        want = best[node + 1]
        return next((c for c in children if proposal.tokens[c] == want), None), want

    return _walk(proposal, step)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what is left of p once a draft from q was rejected."""
    r = (p - q).clamp(min=0)
    total = r.sum()
    return r / total if total > 0 else p


def rejection(proposal, logits, params, generator) -> tuple[list[int], int]:
    """Lossless: output distributed exactly as the target's warped distribution.

    A chain is Leviathan et al.'s test (fused kernel). A tree is multi-draft recursive rejection
    sampling (SpecInfer; Jeon et al.): at a node the children are tried in order, each accepted
    with min(1, p(x)/q(x)); a rejection replaces p by the residual norm(max(0, p - q)), and when
    every child is rejected the token is drawn from the last residual.
    """
    if params.greedy:
        return greedy(proposal, logits, params, generator)
    p_all = warp(logits, params)
    if proposal.is_chain:
        drafts = torch.tensor(proposal.tokens, dtype=torch.long, device=logits.device)
        uniforms = torch.rand(len(drafts), generator=generator, device=generator.device)
        return _read(*kernels.verify_rejection(drafts, proposal.probs, p_all, uniforms, uniform(generator)))

    def step(node, children):
        p = p_all[node + 1]
        for c in children:
            x = proposal.tokens[c]
            q = proposal.probs[c] if proposal.probs is not None else torch.nn.functional.one_hot(
                torch.tensor(x, device=p.device), p.shape[-1]).to(p.dtype)
            if uniform(generator) * q[x] < p[x]:
                return c, None
            p = residual(p, q)
        return None, sample(p, uniform(generator))

    return _walk(proposal, step)


def target_match(proposal, logits, params, generator) -> tuple[list[int], int]:
    """Sample the target at each node; descend into the child equal to that sample (lossless)."""
    if params.greedy:
        return greedy(proposal, logits, params, generator)
    p_all = warp(logits, params)

    def step(node, children):
        token = sample(p_all[node + 1], uniform(generator))
        return next((c for c in children if proposal.tokens[c] == token), None), token

    return _walk(proposal, step)


def topp(proposal, logits, params, generator) -> tuple[list[int], int]:
    """Accept a draft lying inside the target's top-p nucleus (lossy: trades exactness for speed)."""
    if params.greedy:
        return greedy(proposal, logits, params, generator)
    p_all = warp(logits, params)
    mass = params.top_p if params.top_p < 1 else TOPP_VERIFY_MASS
    sorted_p, order = torch.sort(p_all, dim=-1, descending=True)
    inside_sorted = (torch.cumsum(sorted_p, dim=-1) - sorted_p) < mass
    inside = torch.zeros_like(inside_sorted).scatter_(-1, order, inside_sorted)

    def step(node, children):
        child = next((c for c in children if bool(inside[node + 1, proposal.tokens[c]])), None)
        return (child, None) if child is not None else (None, sample(p_all[node + 1], uniform(generator)))

    return _walk(proposal, step)


def typical(proposal, logits, params, generator) -> tuple[list[int], int]:
    """Medusa's typical acceptance (lossy): a draft passes when the target's warped probability of it
    exceeds min(TYPICAL_EPSILON, TYPICAL_DELTA * exp(-H)), H the entropy at its parent. As in Medusa,
    the longest path whose every draft passes stands (ties: the likeliest under the target); the
    next token is drawn from the target's distribution at its end."""
    if params.greedy:
        return greedy(proposal, logits, params, generator)
    p_all = warp(logits, params)
    entropy = torch.special.entr(p_all).sum(dim=-1)
    threshold = (TYPICAL_DELTA * torch.exp(-entropy)).clamp(max=TYPICAL_EPSILON)
    parents = proposal.parents if proposal.parents is not None else list(range(-1, len(proposal.tokens) - 1))
    rows = torch.tensor([parent + 1 for parent in parents], dtype=torch.long, device=p_all.device)
    p_draft = p_all[rows, torch.tensor(proposal.tokens, dtype=torch.long, device=p_all.device)]
    passes = (p_draft > threshold[rows]).tolist()
    log_p = torch.log(p_draft).tolist()
    # (depth, log-likelihood) of each draft whose whole path passes; parents come before children.
    score: dict[int, tuple[int, float]] = {-1: (0, 0.0)}
    for i, parent in enumerate(parents):
        if passes[i] and parent in score:
            score[i] = (score[parent][0] + 1, score[parent][1] + log_p[i])
    end = max(score, key=lambda i: score[i])
    path, node = [], end
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1], sample(p_all[end + 1], uniform(generator))


def accept_all(proposal, logits, params, generator) -> tuple[list[int], int]:
    """The first child at every level stands (debugging; a chain's tokens per iteration is k+1,
    to measure loop overhead)."""
    def step(node, children):
        return (children[0], None) if children else (None, pick(logits[node + 1], params, generator))

    return _walk(proposal, step)


def reject_all(proposal, logits, params, generator) -> tuple[list[int], int]:
    """No draft stands: the target's own token only (debugging; and plain decoding, which has none)."""
    return [], pick(logits[0], params, generator)


# --verify choices.
VERIFIERS: dict[str, Verifier] = {
    "greedy": greedy,
    "rejection": rejection,
    "topp": topp,
    "typical": typical,
    "target_match": target_match,
}
# --accept-policy choices: "normal" verifies with the --verify verifier; the others replace it.
POLICIES: dict[str, Verifier | None] = {
    "normal": None,
    "accept_all": accept_all,
    "reject_all": reject_all,
}


def check_names(verify: str | None, policy: str) -> None:
    """Refuse unknown verifier / policy names (at the boundary, before anything loads)."""
    if verify is not None and verify not in VERIFIERS:
        raise SpecliteError(f"unknown verifier '{verify}': choose from {', '.join(VERIFIERS)}")
    if policy not in POLICIES:
        raise SpecliteError(f"unknown accept policy '{policy}': choose from {', '.join(POLICIES)}")


def get_verifier(name: str | None, params: SamplingParams, policy: str = "normal") -> Verifier:
    """The verifier for one request: the policy's, else the named one; by default greedy at
    temperature 0 and rejection sampling otherwise."""
    check_names(name, policy)
    if POLICIES[policy] is not None:
        return POLICIES[policy]
    if name is None:
        name = "greedy" if params.greedy else "rejection"
    if name == "greedy" and not params.greedy:
        raise SpecliteError("--verify greedy needs temperature 0; use rejection (lossless) for sampling")
    return VERIFIERS[name]
