"""The suffix tree against brute-force counting over the raw sequences, on fresh random inputs.

Small alphabets make the sequences repetitive, so every update case (new leaf, leaf growth,
split, a node growing into its only child, absorbing it) is exercised many times.
"""

import random

import pytest

from speclite.speculate.suffix_cache import ResponseCache
from speclite.speculate.suffix_tree import SuffixTree, _subtree_size, advance, continuation, matches


def occurrences(seqs, w) -> int:
    n = len(w)
    return sum(1 for s in seqs for j in range(len(s) - n + 1) if list(s[j : j + n]) == list(w))


def tree_count(tree, w) -> int:
    pos = (tree.root, 0)
    for t in w:
        pos = tree.walk(*pos, t)
        if pos is None:
            return 0
    return pos[0].count


def random_seqs(rng, alphabet, n_seqs, max_len):
    return [[rng.randrange(alphabet) for _ in range(rng.randint(0, max_len))] for _ in range(n_seqs)]


def assert_counts(tree, seqs, probes):
    """Every substring up to max_depth (and random probes) counted as often as it occurs."""
    depth = tree.max_depth
    assert tree.root.count == sum(len(s) for s in seqs)
    assert tree.nodes == _subtree_size(tree.root)
    for s in seqs:
        for j in range(len(s)):
            for n in range(1, min(depth, len(s) - j) + 1):
                assert tree_count(tree, s[j : j + n]) == occurrences(seqs, s[j : j + n])
    for w in probes:
        expected = occurrences(seqs, w) if len(w) <= depth else 0
        assert tree_count(tree, w) == expected


@pytest.mark.parametrize("seed", range(40))
def test_counts_match_brute_force(seed):
    rng = random.Random(seed)
    depth, alphabet = rng.randint(1, 9), rng.randint(1, 5)
    seqs = random_seqs(rng, alphabet, rng.randint(1, 5), 40)
    tree = SuffixTree(depth)
    for s in seqs:
        growing = tree.start()
        for t in s:  # one token at a time, as a request grows
            tree.append(growing, t)
    probes = [[rng.randrange(alphabet) for _ in range(rng.randint(1, depth + 2))] for _ in range(50)]
    assert_counts(tree, seqs, probes)


def test_repeated_text_stays_compressed():
    """A response repeated many times costs nodes for its distinct suffixes, not per copy."""
    rng = random.Random(3)
    text = [rng.randrange(1000) for _ in range(200)]
    tree = SuffixTree(64)
    tree.start(text)
    once = tree.nodes
    for _ in range(20):
        tree.start(text)
    assert tree.nodes == once
    assert tree_count(tree, text[50:114]) == 21


@pytest.mark.parametrize("seed", range(20))
def test_oldest_first_eviction_equals_never_having_seen_them(seed):
    rng = random.Random(100 + seed)
    depth, limit = rng.randint(1, 8), rng.randint(1, 3)
    seqs = random_seqs(rng, rng.randint(1, 4), rng.randint(limit + 1, 7), 30)
    cache = ResponseCache(depth, limit)
    for s in seqs:
        cache.add(s)
    kept = [s for s in seqs if s][-limit:]
    assert [r.tolist() for r in cache.responses] == kept
    probes = [[rng.randrange(4) for _ in range(rng.randint(1, depth))] for _ in range(50)]
    assert_counts(cache.tree, kept, probes)
    # What is left still grows correctly.
    more = random_seqs(rng, 4, 2, 30)
    for s in more:
        cache.add(s)
    assert_counts(cache.tree, [r.tolist() for r in cache.responses], probes)


def test_unbounded_and_disabled_cache():
    cache = ResponseCache(8, -1)
    for i in range(50):
        cache.add([i, i + 1, i + 2])
    assert len(cache.responses) == 50 and cache.tokens == 150
    off = ResponseCache(8, 0)
    off.add([1, 2, 3])
    assert off.tokens == 0 and off.tree.root.count == 0


@pytest.mark.parametrize("seed", range(30))
def test_greedy_continuation_matches_brute_force(seed):
    """Each drafted token is a most frequent follower; probabilities multiply count ratios."""
    rng = random.Random(200 + seed)
    depth, alphabet = rng.randint(2, 8), rng.randint(2, 4)
    seqs = random_seqs(rng, alphabet, 3, 40)
    tree = SuffixTree(depth)
    for s in seqs:
        tree.start(s)
    context = [rng.randrange(alphabet) for _ in range(12)]
    found = matches(tree, context)
    for length, (node, idx) in enumerate(found, 1):
        pattern = context[-length:]
        assert tree_count(tree, pattern) == occurrences(seqs, pattern) > 0
        min_prob = rng.choice([0.0, 0.1, 0.4])
        tokens, score = continuation(node, idx, 6, min_prob)
        w, prob, expected_score = list(pattern), 1.0, 0.0
        for t in tokens:
            followers = {x: occurrences(seqs, w + [x]) if len(w) < depth else 0 for x in range(alphabet)}
            assert followers[t] == max(followers.values()) > 0
            prob *= followers[t] / occurrences(seqs, w)
            assert prob >= min_prob
            expected_score += prob
            w.append(t)
        assert score == pytest.approx(expected_score)
        if len(tokens) < 6 and len(w) < depth:  # it stopped early: nothing likely enough follows
            followers = [occurrences(seqs, w + [x]) for x in range(alphabet)]
            assert max(followers) == 0 or prob * max(followers) / occurrences(seqs, w) < min_prob
    # The matched lengths are exactly the suffixes that occur (up to max_depth).
    occurring = [n for n in range(1, min(depth, len(context)) + 1) if occurrences(seqs, context[-n:])]
    assert len(found) == (max(occurring) if occurring else 0)


def test_matches_follow_the_context_incrementally():
    rng = random.Random(7)
    tree = SuffixTree(6)
    for s in random_seqs(rng, 3, 4, 30):
        tree.start(s)
    context = [rng.randrange(3) for _ in range(40)]
    found = []
    for i, t in enumerate(context):
        found = advance(tree, found, t)
        assert [(n, j) for n, j in found] == matches(tree, context[max(0, i - 5) : i + 1])
