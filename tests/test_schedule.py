"""`--gen-num-per-cycle auto`: the k it settles on maximises tokens per second on the machine it
measures, whatever shape that machine's costs have; and plain steps it chooses run as the loop's
calls with the proposer kept in step."""

import random

import pytest

from speclite import LLM, SamplingParams
from speclite.api import SpecConfig
from speclite.engine import loop
from speclite.speculate.schedule import AdaptiveSpecLength, SpecLength

K_MAX = 8


def accept_at(a, j: int) -> float:
    """The chance draft j stands once the drafts before it have: `a` for every position, or a(j)."""
    return a(j) if callable(a) else a


def tokens_per_iteration(a, k: int) -> float:
    total, reach = 1.0, 1.0
    for j in range(1, k + 1):
        reach *= accept_at(a, j)
        total += reach
    return total


def less_sure_further_out(j: int) -> float:
    """A drafter whose later drafts stand less often (the pair's PARD: 77% of first drafts, 11% of fifth)."""
    return 0.8 * 0.75 ** (j - 1)


# (regime, acceptance per draft (or per position), drafting (fixed, per draft) and verifying (fixed, per
# row past the first) in seconds). The best k of each is found below by brute force over the true costs.
MACHINES = [
    ("a drafter less sure further out, compute-bound target (the pair's PARD on Zen 5)", less_sure_further_out,
     (23e-6, 4e-6), (105e-6, 30e-6)),
    ("a drafter less sure further out, memory-bound target", less_sure_further_out, (2e-3, 2e-4), (30e-3, 3e-4)),
    ("memory-bound target, parallel drafter", 0.7, (2e-3, 2e-4), (30e-3, 3e-4)),
    ("memory-bound target, autoregressive draft", 0.6, (0.0, 6e-3), (30e-3, 3e-4)),
    ("compute-bound target: each row 0.6 of a step (the pair on Zen 4, fp32)", 0.72, (30e-6, 10e-6), (174e-6, 105e-6)),
    ("compute-bound target, free drafts all accepted", 1.0, (0.0, 0.0), (174e-6, 105e-6)),
    ("half-bound target, parallel drafter", 0.8, (40e-6, 8e-6), (150e-6, 40e-6)),
    ("a draft never right", 0.0, (0.0, 6e-3), (30e-3, 3e-4)),
]


def true_cost(draft, verify, k: int) -> float:
    return (draft[0] + draft[1] * k if k else 0.0) + verify[0] + verify[1] * k


def settle(length: SpecLength, a: float, draft, verify, calls: int = 200, seed: int = 0, slow=None) -> list[int]:
    """Run `calls` of the loop's calls (20 iterations each, at the k asked for) against the machine; the
    ks asked. slow(call, k): how much slower that call runs (a slow spell; default none)."""
    rng, asked = random.Random(seed), []
    for c in range(calls):
        k = length.next_k()
        asked.append(k)
        for _ in range(20):
            accepted = 0
            while accepted < k and rng.random() < accept_at(a, accepted + 1):
                accepted += 1
            noise = (1 + 0.05 * (rng.random() - 0.5)) * (slow(c, k) if slow else 1.0)  # a loaded machine's timings
            d = (draft[0] + draft[1] * k) * noise if k else 0.0
            length.observe(k, accepted, d, (verify[0] + verify[1] * k) * noise)
    return asked


@pytest.mark.parametrize("regime,a,draft,verify", MACHINES, ids=[m[0] for m in MACHINES])
def test_auto_settles_on_the_fastest_k(regime, a, draft, verify):
    rate = {k: tokens_per_iteration(a, k) / true_cost(draft, verify, k) for k in range(K_MAX + 1)}
    best = max(rate, key=rate.get)
    length = AdaptiveSpecLength(k_max=K_MAX)
    asked = settle(length, a, draft, verify)
    # What the last 100 calls got (near-ties may trade places: the acceptance is estimated from draws,
    # the timings are noisy; plain decoding's probes cost their share): within 5% of the best k's rate.
    got = sum(rate[k] for k in asked[-100:]) / 100
    assert got >= 0.95 * rate[best], (regime, best, asked[-100:], rate)


FALLING = [  # (regime, acceptance by position, drafting, verifying): one rate for every position misjudges k
    ("a sure first draft, unsure later ones", lambda j: 0.95 if j == 1 else 0.3, (23e-6, 4e-6), (105e-6, 30e-6)),
    ("falling by 0.7 a position, memory-bound target", lambda j: 0.9 * 0.7 ** (j - 1), (2e-3, 2e-4), (30e-3, 3e-4)),
    ("falling by 0.7 a position, autoregressive draft", lambda j: 0.9 * 0.7 ** (j - 1), (0.0, 6e-3), (30e-3, 3e-4)),
]


@pytest.mark.parametrize("regime,a,draft,verify", FALLING, ids=[m[0] for m in FALLING])
def test_auto_reads_acceptance_per_position(regime, a, draft, verify):
    """A drafter less sure further out: k from each position's own acceptance lands within 2% of the
    best k's rate (one rate for all positions, the geometric model, got 94-97%)."""
    rate = {k: tokens_per_iteration(a, k) / true_cost(draft, verify, k) for k in range(K_MAX + 1)}
    best = max(rate, key=rate.get)
    for seed in range(3):
        asked = settle(AdaptiveSpecLength(k_max=K_MAX), a, draft, verify, seed=seed)
        assert sum(rate[k] for k in asked[-100:]) / 100 >= 0.98 * rate[best], (regime, seed, best, asked[-100:])


@pytest.mark.parametrize("forget_after,settles", [(32, True), (10**9, False)])
def test_a_slow_spell_does_not_rule_a_k_out_for_good(forget_after, settles):
    """Plain steps the fastest, but 5x slower in calls 5-15 (a neighbour's load on a shared machine):
    that figure is forgotten once not measured again, and the schedule comes back to plain decoding.
    Kept for good (forget_after too long), it keeps the schedule speculating."""
    a, draft, verify = 0.72, (30e-6, 10e-6), (174e-6, 105e-6)
    rate = {k: tokens_per_iteration(a, k) / true_cost(draft, verify, k) for k in range(K_MAX + 1)}
    length = AdaptiveSpecLength(k_max=K_MAX, forget_after=forget_after)
    asked = settle(length, a, draft, verify, calls=300, slow=lambda c, k: 5.0 if 5 <= c < 15 else 1.0)
    assert (sum(rate[k] for k in asked[-100:]) / 100 >= 0.95 * rate[0]) == settles, asked[-100:]


def test_a_compute_bound_target_makes_plain_decoding_win_where_a_flat_verification_would_draft_the_most():
    """The pair on Zen 4 in fp32: each verified row costs 0.6 of a plain step. Charged as one flat pass
    (the schedule before it measured cost per k), k = 8 looked best; measured, no k pays."""
    a, draft, verify = 0.72, (30e-6, 10e-6), (174e-6, 105e-6)
    measured = verify[0] + verify[1] * K_MAX  # one verification figure for every k, plain steps too
    flat = {k: tokens_per_iteration(a, k) / ((draft[0] + draft[1] * K_MAX if k else 0.0) + measured) for k in range(K_MAX + 1)}
    assert max(flat, key=flat.get) == K_MAX
    length = AdaptiveSpecLength(k_max=K_MAX)
    settle(length, a, draft, verify)
    assert length.k == 0


def call(length: AdaptiveSpecLength, proposed: int, accepted: int, draft_s: float | None = None, verify_s: float | None = None) -> int:
    """One call of one iteration: the k the schedule asks for, then what the iteration gave."""
    k = length.next_k()
    length.observe(proposed, accepted, draft_s, verify_s)
    return k


def test_first_calls_measure_k_max_then_half_of_it_then_plain_steps():
    length = AdaptiveSpecLength(k_max=K_MAX)
    assert call(length, K_MAX, 1) == K_MAX  # untimed (a request's first iteration): no cost known yet
    assert call(length, K_MAX, 1, 1e-3, 4e-3) == K_MAX  # a warm-up: k's first timed call is not kept
    assert call(length, K_MAX, 1, 1e-3, 4e-3) == K_MAX and set(length.costs) == {K_MAX}
    assert call(length, K_MAX // 2, 1, 0.5e-3, 2.5e-3) == K_MAX // 2
    assert call(length, K_MAX // 2, 1, 0.5e-3, 2.5e-3) == K_MAX // 2
    assert call(length, 0, 0, 0.0, 1e-3) == 0  # plain steps might win (3 ms for 4 drafts, one of them standing)
    assert call(length, 0, 0, 0.0, 1e-3) == 0
    assert set(length.costs) == {K_MAX, K_MAX // 2, 0}


def test_the_lines_fill_in_the_ks_not_measured():
    length = AdaptiveSpecLength(k_max=K_MAX)
    for k, d, v in [(2, 3.0, 12.0), (4, 5.0, 16.0), (8, 9.0, 24.0)]:  # drafting 1 + k, verifying 8 + 2k
        for _ in range(2):  # the first call of each k warms it up
            call(length, k, 0, d, v)
    assert length.cost(6) == pytest.approx(7.0 + 20.0)
    assert length.cost(4) == pytest.approx(21.0)  # measured
    assert length.cost(0) == pytest.approx(8.0)  # plain steps: verifying only
    for _ in range(2):
        call(length, 0, 0, 0.0, 5.0)
    assert length.cost(0) == pytest.approx(5.0)  # measured: not the lines' 8


def test_plain_steps_are_measured_only_where_they_might_win():
    """All drafts accepted and verification nearly free: plain decoding is never tried. Each row a
    whole step: it is."""
    for per_row, tried in [(1e-4, False), (1.0, True)]:
        length = AdaptiveSpecLength(k_max=K_MAX)
        ks = [call(length, k, k, 0.0, 1.0 + per_row * k) for k in [K_MAX] * 2 + [K_MAX // 2] * 2 + [K_MAX] * 10]
        assert (0 in ks) == tried, ks


class Alternating(SpecLength):
    """Plain calls and speculative ones in turn."""

    def __init__(self, k: int):
        super().__init__(k)
        self.calls = 0

    def next_k(self) -> int:
        self.calls += 1
        return 0 if self.calls % 2 else self.k


DRAFTS = {"pard": "tiny-code-pard", "vanilla": "tiny-code-draft", "eagle3": "tiny-code-eagle3",
          "dflash": "tiny-code-dflash"}


@pytest.mark.parametrize("method,temperature", [("pard", 0.0), ("vanilla", 0.0), ("pard", 0.8), ("eagle3", 0.0),
                                                ("eagle3", 0.8), ("dflash", 0.0)])
def test_plain_calls_keep_the_proposer_in_step(method, temperature, monkeypatch):
    """Plain calls under a proposer (auto's k = 0) run as the target's chain and the proposer sees
    their tokens, and the target's states where it drafts from them (EAGLE-3, DFlash): greedy output
    is plain decoding's, the proposer's sequence is the request's, and the drafts after plain calls
    still land."""
    monkeypatch.setattr(loop, "CHUNK_S", 0.001)  # calls of a few steps: several of both kinds, on fast CPUs too
    llm = LLM("tiny-code", SpecConfig(method, k=3, draft=DRAFTS[method]))
    params = SamplingParams(max_new_tokens=200, ignore_eos=True, temperature=temperature, seed=1)
    prompt = "def add(a, b):"
    steady = llm.generate(prompt, params)[0].aux_info["accept_rate"]
    llm.engine.spec.length = Alternating(3)
    chains = []
    target = llm.engine.target
    run = target.chain

    def spy(*args):
        out = run(*args)
        chains.append(out[0])
        return out

    monkeypatch.setattr(target, "chain", spy)
    out = llm.generate(prompt, params)[0]
    assert len(chains) >= 3 and sum(map(len, chains)) >= 30  # the plain calls ran as chains, not step by step
    if temperature == 0:
        assert out.token_ids == LLM("tiny-code").generate(prompt, params)[0].token_ids
    assert llm.engine.spec.proposer.tokens == llm.engine.tokenizer.encode(prompt) + out.token_ids
    assert llm.engine.spec.length.calls > 6
    assert out.aux_info["accept_rate"] > 0.5 * steady  # out of step, its drafts would all but never land
