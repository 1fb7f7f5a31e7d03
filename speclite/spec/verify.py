"""Verifiers: given k drafts and the target's k+1 logits, how many drafts stand and which token follows.

Each is a callable (drafts, draft_probs, logits, params, generator) -> (accepted, next_token).
At temperature 0 every verifier reduces to greedy verification, which is what each of them means
for a one-hot target distribution.
"""

from __future__ import annotations

from typing import Callable

import torch

from speclite import kernels
from speclite.engine.sampling import SamplingParams, sample, warp
from speclite.errors import SpecliteError

Verifier = Callable[[list[int], "torch.Tensor | None", torch.Tensor, SamplingParams, torch.Generator], tuple[int, int]]

# Nucleus mass the `topp` verifier accepts drafts from when the request itself sets no top_p.
TOPP_VERIFY_MASS = 0.8


def _drafts(drafts: list[int], logits: torch.Tensor) -> torch.Tensor:
    return torch.tensor(drafts, dtype=torch.long, device=logits.device)


def greedy(drafts, draft_probs, logits, params, generator) -> tuple[int, int]:
    """Accept while the draft equals the target's argmax."""
    accepted, token = kernels.verify_greedy(_drafts(drafts, logits), logits)
    return int(accepted), int(token)


def rejection(drafts, draft_probs, logits, params, generator) -> tuple[int, int]:
    """Leviathan et al.: lossless; output is distributed exactly as the target's warped distribution."""
    if params.greedy:
        return greedy(drafts, draft_probs, logits, params, generator)
    p = warp(logits, params)
    uniforms = torch.rand(len(drafts), generator=generator, device=generator.device)
    residual = torch.rand((), generator=generator, device=generator.device)
    accepted, token = kernels.verify_rejection(_drafts(drafts, logits), draft_probs, p, uniforms, residual)
    return int(accepted), int(token)


def target_match(drafts, draft_probs, logits, params, generator) -> tuple[int, int]:
    """Sample the target at each position; accept while the draft equals that sample (lossless)."""
    if params.greedy:
        return greedy(drafts, draft_probs, logits, params, generator)
    p = warp(logits, params)
    for i in range(len(drafts) + 1):
        token = sample(p[i], torch.rand((), generator=generator, device=generator.device))
        if i == len(drafts) or token != drafts[i]:
            return i, token
    raise AssertionError("unreachable: the loop returns at i == len(drafts)")


def topp(drafts, draft_probs, logits, params, generator) -> tuple[int, int]:
    """Accept a draft lying inside the target's top-p nucleus (lossy: trades exactness for speed)."""
    if params.greedy:
        return greedy(drafts, draft_probs, logits, params, generator)
    p = warp(logits, params)
    mass = params.top_p if params.top_p < 1 else TOPP_VERIFY_MASS
    sorted_p, order = torch.sort(p, dim=-1, descending=True)
    inside_sorted = (torch.cumsum(sorted_p, dim=-1) - sorted_p) < mass
    inside = torch.zeros_like(inside_sorted).scatter_(-1, order, inside_sorted)
    accepted = 0
    while accepted < len(drafts) and bool(inside[accepted, drafts[accepted]]):
        accepted += 1
    return accepted, sample(p[accepted], torch.rand((), generator=generator, device=generator.device))


VERIFIERS: dict[str, Verifier] = {
    "greedy": greedy,
    "rejection": rejection,
    "topp": topp,
    "target_match": target_match,
}


def get_verifier(name: str | None, params: SamplingParams) -> Verifier:
    """The named verifier; by default greedy at temperature 0 and rejection sampling otherwise."""
    if name is None:
        name = "greedy" if params.greedy else "rejection"
    if name not in VERIFIERS:
        raise SpecliteError(f"unknown verifier '{name}': choose from {', '.join(VERIFIERS)}")
    if name == "greedy" and not params.greedy:
        raise SpecliteError("--verify greedy needs temperature 0; use rejection (lossless) for sampling")
    return VERIFIERS[name]
