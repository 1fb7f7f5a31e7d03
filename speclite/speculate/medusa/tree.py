"""Medusa trees: paths of top-k ranks, one rank per head ([0] = head 0's best token, [0, 1] = head 1's
second best after it), in the order they are verified; any prefix of the order is a tree.

`--medusa-tree` takes Medusa's own `medusa_choices` format (e.g. [[0], [1], [0, 0], [0, 1]]), sorted
shortest first as Medusa does. Without one, `--medusa-topk K` builds a default: the paths of highest
prior, where a rank-r token at any level is assumed right with probability PRIOR / (r + 1)^2 — a
fixed guess shaped like measured head accuracies (top-1 far ahead, later heads weaker), not a
measurement. K = 1 is the chain of each head's argmax.
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path

from speclite.errors import SpecliteError

Ranks = tuple[int, ...]
PRIOR = 0.6


def default_tree(topk: int, depth: int, size: int) -> list[Ranks]:
    """The `size` paths of highest prior (ranks < topk, at most `depth` long), best first.

    A child's prior is below its parent's, so parents come first."""
    heap = [(-PRIOR / (r + 1) ** 2, (r,)) for r in range(topk)]
    paths: list[Ranks] = []
    while heap and len(paths) < size:
        neg, path = heapq.heappop(heap)
        paths.append(path)
        if len(path) < depth:
            for r in range(topk):
                heapq.heappush(heap, (neg * PRIOR / (r + 1) ** 2, path + (r,)))
    return paths


def parse_tree(text: str) -> list[Ranks]:
    """A --medusa-tree value (JSON, or a file holding it) -> its paths, shortest first."""
    source = "--medusa-tree"
    if not text.lstrip().startswith("["):
        file = Path(text).expanduser()
        if not file.is_file():
            raise SpecliteError(f"--medusa-tree is neither a JSON list of paths nor a file: '{text}'")
        source, text = str(file), file.read_text()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecliteError(f"{source} is not valid JSON ({e})") from None
    if not isinstance(raw, list) or not raw or not all(
            isinstance(p, list) and p and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in p)
            for p in raw):
        raise SpecliteError(f"{source} must be a non-empty list of paths of top-k ranks, e.g. [[0], [1], [0, 0]]")
    paths = sorted({tuple(p) for p in raw}, key=lambda p: (len(p), p))
    known = set(paths)
    for p in paths:
        if len(p) > 1 and p[:-1] not in known:
            raise SpecliteError(f"{source}: path {list(p)} has no parent {list(p[:-1])} in the tree")
    return paths
