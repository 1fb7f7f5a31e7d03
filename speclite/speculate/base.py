"""The proposer interface: every speculation method is a small class behind these three calls."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from speclite.kernels import cpu_sampling
from speclite.model.step import NOTHING, Step, Wants
from speclite.sampling import SamplingParams


@dataclass
class RequestContext:
    params: SamplingParams
    generator: torch.Generator  # the request's own: drafts sampled from it keep runs reproducible
    device: torch.device
    extra: dict = field(default_factory=dict)  # sp_advice_prompt token ids, sp_edit flag
    # The prefill's hidden states (what `wants` asked for), row r = prompt position prompt_from + r;
    # the prompt's last token comes in the first observe(). None when nothing is wanted.
    prompt_states: Step | None = None
    prompt_from: int = 0


@dataclass
class Proposal:
    """Draft tokens continuing the sequence: a chain, or a tree when `parents` is given.

    `parents[i]`: index of draft i's parent in `tokens` (-1 = the last committed token); a parent
    comes before its children, and siblings are tried in order. None is a chain ([-1, 0, 1, ...]).
    `probs` [n, V]: probs[i] is the warped draft distribution token i was drawn from (for
    siblings drawn without replacement, the distribution after removing the earlier ones), for
    rejection sampling; None for deterministic proposers (one-hot draft distributions).
    `parts`: (name, count) stretches of a chain in order, for a proposal that several proposers
    drafted (hybrid: the model's drafts, then n-gram ones); the stats report acceptance per part.
    """

    tokens: list[int]
    probs: torch.Tensor | None = None
    parents: list[int] | None = None
    parts: tuple[tuple[str, int], ...] | None = None

    @property
    def is_chain(self) -> bool:
        return self.parents is None or self.parents == list(range(-1, len(self.tokens) - 1))

    def children(self) -> dict[int, list[int]]:
        """Node (-1 = the committed token) -> its children's indices, in order."""
        kids: dict[int, list[int]] = {}
        for i, parent in enumerate(self.parents if self.parents is not None else range(-1, len(self.tokens) - 1)):
            kids.setdefault(parent, []).append(i)
        return kids

    def depth(self) -> int:
        """Levels of the tree (a chain's length)."""
        if self.parents is None:
            return len(self.tokens)
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return max(depths, default=0)


class Iteration(NamedTuple):
    """One speculative iteration run by a proposer's greedy_run: drafts offered and stood, the new
    tokens (the stood drafts and the target's token), seconds spent drafting and verifying."""

    drafted: int
    accepted: int
    tokens: list[int]
    draft_s: float
    verify_s: float
    depth: int | None = None  # a tree's levels (None: a chain, as deep as its drafts)
    parts: tuple[tuple[str, int], ...] | None = None  # Proposal.parts


class Proposer(ABC):
    name: str = "proposer"

    @abstractmethod
    def begin(self, prompt_ids: list[int], ctx: RequestContext) -> None:
        """A new request (or a new chat turn) starts with this whole token sequence."""

    @abstractmethod
    def propose(self, k: int) -> Proposal:
        """Up to k drafts following the sequence seen so far (fewer, or none, is fine)."""

    def catch_up(self) -> None:
        """Read what the sequence holds that this proposer has not read yet, before the loop times a
        call that drafts (a draft model: the prompt, and the tokens decoded plainly since it last
        drafted): drafting's time is then drafting's, and a request decoded plainly never pays for
        it. Nothing by default."""

    wants: Wants = NOTHING  # hidden states of the target this proposer drafts from

    @abstractmethod
    def observe(self, tokens: list[int], states: Step | None = None) -> None:
        """These tokens were appended to the sequence (accepted drafts + the target's token).

        `states`: the target's hidden states that `wants` asked for, row j for the token fed in
        that produced tokens[j] (the last committed token, then each accepted draft); None when
        nothing is wanted.
        """

    def greedy_run(self, target, cache, token: int, k: int, room: int, enough: int, eos: set[int],
                   seconds: float) -> list[Iteration] | None:
        """Greedy iterations with k drafts each, run with the target (its `cache` fed `token` and
        the drafts) without Python between them, for about `seconds`, until a new token is in `eos`
        or until `enough` new tokens are out (k is not cut to that, only to `room`, the most new
        tokens there may be): the tokens the loop would give, the caches and this proposer's state
        left as its iterations would leave them. None (no kernel_run, or where the models cannot):
        the loop runs its iterations one by one."""
        return self.kernel_run(target, cache, token, k, room, enough, eos, seconds, None, None)

    def sampled_run(self, target, cache, token: int, k: int, room: int, enough: int, eos: set[int], seconds: float,
                    params, generator) -> list[Iteration] | None:
        """As greedy_run under rejection sampling (params: the request's SamplingParams): drafts drawn
        from this proposer's warped distributions and verified as the `rejection` verifier verifies
        a chain, with the generator's uniforms taken in the loop's order, so the tokens and the
        generator's state are those of the iterations one by one. None (no kernel_run, or where the
        models cannot): the loop runs its iterations one by one."""
        return self.kernel_run(target, cache, token, k, room, enough, eos, seconds, cpu_sampling.Warp.of(params),
                               generator)

    def kernel_run(self, target, cache, token: int, k: int, room: int, enough: int, eos: set[int], seconds: float,
                   warp, generator) -> list[Iteration] | None:
        """greedy_run (warp None) and sampled_run (a cpu_sampling.Warp, the generator whose uniforms
        the call takes): a proposer's iterations in one call of the CPU kernels. None by default."""
        return None

    def states_from(self, prompt_ids: list[int]) -> int:
        """The first position of `prompt_ids` whose target states this proposer (which keeps what it
        drew from earlier ones) still needs: the prefill returns states from there on, recomputing
        positions the target's cache holds if it must. len(prompt_ids) by default: none needed."""
        return len(prompt_ids)

    def finish(self) -> None:
        """The request ended (done, stopped, or abandoned by its consumer); nothing to do by default."""

    def reset(self) -> None:
        """Forget whatever is kept between requests (the next begin() starts cold)."""

    def forget(self) -> None:
        """Also forget what was learned from earlier requests (suffix trees); an explicit call only."""

    def use_static(self) -> None:
        """Run the proposer's own fixed-shape model steps as CUDA graphs (--static); none by default."""

    def resident(self) -> tuple[list, list]:
        """(models, KV caches) this proposer holds, for memory reports; none by default."""
        return [], []
