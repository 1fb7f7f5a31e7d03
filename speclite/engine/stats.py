"""Per-request speculation statistics: the aux_info of every output and the live chat panel."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RequestStats:
    iter_count: int = 0
    output_len: int = 0
    proposed: int = 0
    accepted: int = 0
    # proposed_at[d] / accepted_at[d]: iterations whose drafts reached depth d (0 = 1st draft) /
    # whose accepted path did; for a chain, depth is the draft's position.
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    # A proposal drafted in parts (hybrid: the model's, then n-gram ones): part -> [drafted, accepted].
    parts: dict[str, list[int]] = field(default_factory=dict)
    draft_s: float = 0.0
    verify_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    done_s: float | None = None  # wall time once finished (summed when totals are merged)

    def record(self, num_proposed: int, num_accepted: int, num_emitted: int, depth: int | None = None,
               parts: tuple[tuple[str, int], ...] | None = None, times: int = 1) -> None:
        """One iteration: `num_proposed` drafts `depth` levels deep (a chain: as many as drafts),
        a path of `num_accepted` kept, `num_emitted` tokens out; `parts`: the chain's (name, count)
        stretches, whose accepted drafts are the first num_accepted. times -1 takes the same
        iteration back out (a stop string ended the output before its tokens)."""
        start = 0
        for name, count in parts or ():
            add_part(self.parts, name, times * count, times * min(max(num_accepted - start, 0), count))
            start += count
        depth = num_proposed if depth is None else depth
        self.iter_count += times
        self.output_len += times * num_emitted
        self.proposed += times * num_proposed
        self.accepted += times * num_accepted
        while len(self.proposed_at) < depth:
            self.proposed_at.append(0)
            self.accepted_at.append(0)
        for d in range(depth):
            self.proposed_at[d] += times
            self.accepted_at[d] += times * (d < num_accepted)
        while times < 0 and self.proposed_at and not self.proposed_at[-1]:  # depths no iteration reached
            self.proposed_at.pop(), self.accepted_at.pop()

    def merge(self, other: "RequestStats") -> None:
        """Fold another request's figures in (session and batch totals)."""
        self.iter_count += other.iter_count
        self.output_len += other.output_len
        self.proposed += other.proposed
        self.accepted += other.accepted
        for i in range(len(other.proposed_at)):
            if i == len(self.proposed_at):
                self.proposed_at.append(0)
                self.accepted_at.append(0)
            self.proposed_at[i] += other.proposed_at[i]
            self.accepted_at[i] += other.accepted_at[i]
        for name, (drafted, accepted) in other.parts.items():
            add_part(self.parts, name, drafted, accepted)
        self.draft_s += other.draft_s
        self.verify_s += other.verify_s
        self.done_s = (self.done_s or 0.0) + other.elapsed_s

    def finish(self) -> None:
        self.done_s = time.perf_counter() - self.started

    @property
    def elapsed_s(self) -> float:
        return self.done_s if self.done_s is not None else time.perf_counter() - self.started

    @property
    def avg_tokens_per_iter(self) -> float:
        return self.output_len / self.iter_count if self.iter_count else 0.0

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def accepted_per_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]

    @property
    def tokens_per_s(self) -> float:
        return self.output_len / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def aux_info(self) -> dict:
        by_part = {"accepted_by_part": {name: {"drafted": d, "accepted": a} for name, (d, a) in self.parts.items()}}
        return {
            "cost_time_ms": round(self.elapsed_s * 1000, 3),
            "output_len": self.output_len,
            "iter_count": self.iter_count,
            "avg_tokens_per_iter": round(self.avg_tokens_per_iter, 4),
            "accept_rate": round(self.accept_rate, 4),
            "accepted_per_position": [round(x, 4) for x in self.accepted_per_position],
            "draft_time_ms": round(self.draft_s * 1000, 3),
            "verify_time_ms": round(self.verify_s * 1000, 3),
            "tokens_per_s": round(self.tokens_per_s, 3),
            **(by_part if self.parts else {}),
        }


def add_part(parts: dict[str, list[int]], name: str, drafted: int, accepted: int) -> None:
    tally = parts.setdefault(name, [0, 0])
    tally[0] += drafted
    tally[1] += accepted


def parts_summary(parts: dict[str, list[int]]) -> str:
    """'model 12/20 (60%), lookup 3/9 (33%)': drafts accepted / drafted per part, for the UIs."""
    return ", ".join(f"{name} {a}/{d} ({a / d:.0%})" if d else f"{name} 0/0" for name, (d, a) in parts.items())
