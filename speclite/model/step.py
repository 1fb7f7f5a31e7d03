"""What one target forward hands back beside the logits, and the layout of a token tree in a forward.

A proposer that drafts from the target's own states (EAGLE-3, MTP, Medusa, DFlash) says what it
`Wants`; the forward keeps exactly that, for every new token (prefill included), in the same pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Wants:
    """Hidden states asked for beside the logits (none by default: nothing is kept)."""

    final: bool = False  # the final normed hidden state, the lm_head's input (MTP, Medusa)
    layers: tuple[int, ...] = ()  # the inputs of these layers; num_layers = the last layer's output

    def __bool__(self) -> bool:
        return self.final or bool(self.layers)


NOTHING = Wants()


@dataclass
class Step:
    """One forward's result. Row r of every tensor belongs to the r-th token fed in."""

    logits: torch.Tensor  # [T', V]: the last num_logits rows (all T by default)
    final: torch.Tensor | None = None  # [T, H] when Wants.final
    layers: dict[int, torch.Tensor] = field(default_factory=dict)  # layer index -> [T, H]

    @property
    def rows(self) -> int:
        """How many rows its states have (at least one of final and layers is set)."""
        return (self.final if self.final is not None else next(iter(self.layers.values()))).shape[0]

    def select(self, rows: list[int] | torch.Tensor) -> "Step":
        """The hidden states of these rows only (the tokens that stood), logits left out. The first n
        rows (a chain's accepted prefix) are views; other rows are gathered."""
        prefix = isinstance(rows, list) and rows == list(range(len(rows)))
        index = None if prefix else torch.as_tensor(rows, dtype=torch.long, device=self.logits.device)

        def pick(h: torch.Tensor) -> torch.Tensor:
            return h[: len(rows)] if prefix else h.index_select(0, index)

        return Step(
            logits=self.logits.new_empty((0, self.logits.shape[-1])),
            final=None if self.final is None else pick(self.final),
            layers={i: pick(h) for i, h in self.layers.items()},
        )


@dataclass
class Tree:
    """A token tree fed in one forward: row 0 is the last committed token, row 1+i is draft i.

    `depth[r]`: distance from row 0 (its position is committed_len + depth); `mask[r, c]`: row r
    may attend to row c (c is r or one of its ancestors).
    """

    depth: torch.Tensor  # [T] long
    mask: torch.Tensor  # [T, T] bool

    @classmethod
    def of(cls, parents: list[int], device) -> "Tree":
        """From draft parent indices (-1 = the committed token); a chain is [-1, 0, 1, ...]."""
        n = len(parents) + 1
        depth = [0] * n
        mask = torch.eye(n, dtype=torch.bool)
        for i, parent in enumerate(parents):
            row, up = i + 1, parent + 1
            if not 0 <= up < row:
                raise ValueError(f"draft {i} has parent {parent}: parents must come earlier in the proposal")
            depth[row] = depth[up] + 1
            mask[row] |= mask[up]
        return cls(torch.tensor(depth, device=device), mask.to(device))
