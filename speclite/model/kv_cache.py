"""A static, preallocated KV cache for one sequence; rollback is moving a length pointer."""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, max_len: int, head_dim: int, dtype, device):
        self.max_len = max_len
        self.length = 0
        shape = (num_kv_heads, max_len, head_dim)
        self.layers = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)
        ]

    def rollback(self, length: int) -> None:
        """Forget everything past `length` tokens: later writes overwrite the stale entries."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back a cache of {self.length} tokens to {length}")
        self.length = length

    def keep(self, slots: list[int]) -> None:
        """Keep the entries at these ascending slots, moved to slots[0], slots[0]+1, ...; drop the rest.

        After a tree pass the accepted path sits at scattered slots: only those few rows are
        gathered into place (a chain's accepted rows are already in place: a rollback).
        """
        first, n = slots[0], len(slots)
        if list(slots) != list(range(first, first + n)):
            device = self.layers[0][0].device
            src = torch.tensor(slots, device=device)
            dst = torch.arange(first, first + n, device=device)
            for k, v in self.layers:
                k.index_copy_(1, dst, k.index_select(1, src))
                v.index_copy_(1, dst, v.index_select(1, src))
        self.rollback(first + n)

    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


def shared_prefix(cached: list[int], tokens: list[int]) -> int:
    """How many leading tokens two sequences share: the cache entries built for `cached` that stand
    for `tokens` (a new request reusing an earlier one's prefix)."""
    n = 0
    for a, b in zip(cached, tokens):
        if a != b:
            break
        n += 1
    return n
