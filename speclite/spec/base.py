"""The proposer interface: every speculation method is a small class behind these three calls."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from speclite.engine.sampling import SamplingParams


@dataclass
class RequestContext:
    params: SamplingParams
    generator: torch.Generator  # the request's own: drafts sampled from it keep runs reproducible
    device: torch.device
    extra: dict = field(default_factory=dict)  # sp_advice_prompt token ids, sp_edit flag


@dataclass
class Proposal:
    """k draft tokens continuing the sequence, in order.

    `probs` [k, V]: the draft's warped distribution at each position, for rejection sampling;
    None for deterministic proposers (a one-hot draft distribution).
    """

    tokens: list[int]
    probs: torch.Tensor | None = None


class Proposer(ABC):
    name: str = "proposer"

    @abstractmethod
    def begin(self, prompt_ids: list[int], ctx: RequestContext) -> None:
        """A new request (or a new chat turn) starts with this whole token sequence."""

    @abstractmethod
    def propose(self, k: int) -> Proposal:
        """Up to k drafts following the sequence seen so far (fewer, or none, is fine)."""

    @abstractmethod
    def observe(self, tokens: list[int]) -> None:
        """These tokens were appended to the sequence (accepted drafts + the target's token)."""

    def reset(self) -> None:
        """Forget whatever is kept between requests (the next begin() starts cold)."""
