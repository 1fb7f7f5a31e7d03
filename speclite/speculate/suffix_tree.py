"""A depth-limited suffix tree with occurrence counts, grown one token at a time.

Every suffix of every inserted sequence, cut at `max_depth` tokens, is a path from the root; a
node's `count` is how many of those suffixes pass through or end in it, so child.count /
node.count estimates how often that child's token followed the node's string. Unary chains are
compressed: a node holds a segment `seq[start:start + length]` of one sequence that contains it
(the most recent one to reach it, which is what keeps first-in-first-out removal free of
re-pointing). Appending a token updates the at most `max_depth` suffixes still growing, each in
O(1) (SuffixDecoding, Oliaro et al. 2024, and Arctic Inference keep the same kind of tree).

Invariant the update relies on: a growing suffix always ends exactly at a node's end, so a node's
count minus its children's counts is the number of suffixes ending there.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator


class Node:
    __slots__ = ("children", "count", "parent", "seq", "start", "length")

    def __init__(self, parent: Node | None, seq: array | None, start: int, length: int, count: int):
        self.children: dict[int, Node] | None = None  # None for a leaf: most nodes are leaves
        self.parent, self.seq, self.start, self.length, self.count = parent, seq, start, length, count


class Growing:
    """A sequence being inserted: its tokens and where each of its growing suffixes ends."""

    __slots__ = ("seq", "active")

    def __init__(self):
        self.seq = array("i")
        self.active: list[Node] = []  # longest suffix first; suffix of length L is active[-L]


class SuffixTree:
    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = Node(None, None, 0, 0, 0)
        self.root.children = {}
        self.nodes = 1

    def start(self, tokens: Iterable[int] = ()) -> Growing:
        growing = Growing()
        for t in tokens:
            self.append(growing, t)
        return growing

    def append(self, growing: Growing, token: int) -> None:
        seq, active = growing.seq, growing.active
        seq.append(token)
        pos = len(seq) - 1
        if len(active) == self.max_depth:
            active.pop(0)  # that suffix is max_depth long: it stops here
        root = self.root
        active.append(root)
        root.count += 1
        for i, node in enumerate(active):
            if node.count == 1 and node is not root:
                node.length += 1  # the common case, inlined: a leaf only this suffix reaches grows
            else:
                active[i] = self._extend(node, token, seq, pos)

    def _extend(self, node: Node, t: int, seq: array, pos: int) -> Node:
        """The node where a suffix ending at `node` ends once `t` (= seq[pos]) follows it.

        (A node only this suffix reaches, count 1, is a leaf on this very sequence: append()
        grows it in place.)
        """
        root = self.root
        children = node.children
        child = children.get(t) if children is not None else None
        if child is None:
            leaf = Node(node, seq, pos, 1, 1)
            if children is None:
                node.children = {t: leaf}
            else:
                children[t] = leaf
            self.nodes += 1
            return leaf
        if node is not root and node.count == child.count + 1:
            # This suffix is the only one ending here and all others go on into `child`: the
            # node's segment grows by one token instead of branching (keeps chains compressed).
            if child.length == 1:
                child.count += 1
                child.length = node.length + 1
                child.seq, child.start = seq, pos - node.length
                child.parent = node.parent
                node.parent.children[seq[child.start]] = child
                self.nodes -= 1
                return child
            node.length += 1
            node.seq, node.start = seq, pos - node.length + 1
            del children[t]
            child.start += 1
            child.length -= 1
            children[child.seq[child.start]] = child
            return node
        if child.length == 1:
            child.count += 1
            child.seq, child.start = seq, pos
            return child
        # Split: the suffix ends after the child's first token.
        mid = Node(node, seq, pos, 1, child.count + 1)
        child.start += 1
        child.length -= 1
        child.parent = mid
        mid.children = {child.seq[child.start]: child}
        children[t] = mid
        self.nodes += 1
        return mid

    def remove(self, seq: array) -> None:
        """Take out a finished sequence inserted before every other one still in the tree.

        Its suffixes' counts drop; subtrees no other sequence reaches go. Nodes that stay are
        referenced by a later sequence (the latest to reach a node holds it), so nothing needs
        re-pointing.
        """
        n, depth = len(seq), self.max_depth
        for j in range(n):
            self.root.count -= 1
            node, idx, end = self.root, j, min(n, j + depth)
            while idx < end:
                child = node.children[seq[idx]]
                child.count -= 1
                if child.count == 0:
                    del node.children[seq[idx]]
                    if not node.children and node is not self.root:
                        node.children = None
                    self.nodes -= _subtree_size(child)
                    break
                idx += child.length
                node = child

    def walk(self, node: Node, idx: int, t: int) -> tuple[Node, int] | None:
        """Position after reading `t` from (node, idx), idx tokens into node's segment; None: no path."""
        if idx < node.length:
            return (node, idx + 1) if node.seq[node.start + idx] == t else None
        child = node.children.get(t) if node.children is not None else None
        return (child, 1) if child is not None else None


def _subtree_size(node: Node) -> int:
    size, stack = 0, [node]
    while stack:
        n = stack.pop()
        size += 1
        if n.children:
            stack.extend(n.children.values())
    return size


def continuation(node: Node, idx: int, limit: int, min_prob: float) -> tuple[list[int], float]:
    """The most frequent continuation from a matched position, greedily by child count.

    Each token's probability is the product of child.count / node.count along the way; it stops
    at `limit` tokens or before a token whose probability falls below `min_prob`. Returns the
    tokens and their summed probabilities (the expected number accepted: the draft's score).
    """
    tokens: list[int] = []
    prob, score = 1.0, 0.0
    while len(tokens) < limit:
        if idx < node.length:
            tokens.append(node.seq[node.start + idx])
            score += prob
            idx += 1
            continue
        if not node.children:
            break
        child = max(node.children.values(), key=_count)
        prob *= child.count / node.count
        if prob < min_prob:
            break
        node, idx = child, 0
    return tokens, score


def _count(node: Node) -> int:
    return node.count


def has_continuation(node: Node, idx: int) -> bool:
    return idx < node.length or bool(node.children)


def matches(tree: SuffixTree, context: Iterable[int]) -> list[tuple[Node, int]]:
    """Where each suffix of `context` (length 1, 2, ...) ends in the tree, while they match."""
    found: list[tuple[Node, int]] = []
    for t in context:
        found = advance(tree, found, t)
    return found


def advance(tree: SuffixTree, found: list[tuple[Node, int]], t: int) -> list[tuple[Node, int]]:
    """`found` after the context grew by `t`: the suffix of length L+1 matches only if L did."""
    out: list[tuple[Node, int]] = []
    prev: Iterator[tuple[Node, int]] = iter([(tree.root, 0), *found[: tree.max_depth - 1]])
    for node, idx in prev:
        nxt = tree.walk(node, idx, t)
        if nxt is None:
            break
        out.append(nxt)
    return out
