"""How many drafts to ask for each iteration: a fixed k, or k adapted to measured acceptance and cost."""

from __future__ import annotations

from speclite.errors import SpecliteError
from speclite.speculate.registry import Method

DEFAULT_K = 4  # drafts per iteration when neither --gen-num-per-cycle nor the method gives a number
AUTO_K_MAX = 8  # auto's ceiling for a method without a default k of its own
# Plain steps run another path than speculative iterations (a chain of steps per call, no drafting's
# picks and judging): the lines through the drafting k's put their cost at up to 1.3x the measured one
# on the pair. Where that figure leaves plain decoding within this factor of the best k, it is measured.
PLAIN_DOUBT = 1.5
# auto's prior on a draft position's acceptance: the first's 0.7 (optimistic: speculate until measured
# otherwise), each next one's the position before's; worth PRIOR judgements.
PRIOR_ACCEPT, PRIOR = 0.7, 2.0


class SpecLength:
    """A fixed k."""

    def __init__(self, k: int):
        self.k = k

    def next_k(self) -> int:
        return self.k

    def observe(self, proposed: int, accepted: int, draft_s: float | None = None, verify_s: float | None = None) -> None:
        """One iteration: `accepted` of `proposed` drafts stood; drafting and verifying took these
        seconds (None: an iteration whose timing says nothing of its k's cost)."""

    @property
    def label(self) -> str:
        return str(self.k)


class AdaptiveSpecLength(SpecLength):
    """k that maximises expected tokens per second from the measured figures, chosen once per call.

    Each draft position j has its own acceptance rate p_j: of the iterations whose drafts reached j
    (the drafts before it all stood), those where draft j stood too, both sums decaying by `decay` at
    each new judgement there. A drafter is less sure further out (the pair's PARD: 77% of first drafts
    stand, 42% of third ones that are reached, 11% of fifth ones), so one rate for every position
    (the geometric model) promised deep chains tokens they never gave. A position judged little leans
    on the one before it (PRIOR weight), the first on an optimistic 0.7: speculate until measured
    otherwise. k drafts yield 1 + p_1 + p_1 p_2 + ... + p_1...p_k tokens per iteration. Their cost is
    measured per number of drafts offered,
    in wall time: drafting and verifying, moving averages decaying as fast, from each k's second call
    on (a process's first call of a kind ran 5-10x slower than the next on the pair: buffers growing,
    pages touched). A k not measured is read off the least-squares lines through the k >= 1 that are
    (plain steps too, but see PLAIN_DOUBT). Nothing is assumed flat: a verification's rows cost little
    more than one where the target streams its weights from memory, and over half a step each where
    its products are compute-bound (the embedded pair on Zen 4's fp32 FMAs, where no k pays);
    drafting grows by a forward per draft autoregressively, slowly for a parallel drafter.

    The first calls draft k_max, then half as many (two points for the lines), then none where plain
    decoding might win; from then on each k the lines pick gets measured in turn. A figure not
    measured again within `forget_after` calls is forgotten (a slow spell of a shared machine must
    not rule a k out for good) and measured again when needed. Where plain decoding wins, every
    `probe_every` calls one call drafts the best k >= 1, so speculation can come back.
    """

    def __init__(self, k_max: int = AUTO_K_MAX, decay: float = 0.95, probe_every: int = 16, forget_after: int = 32):
        super().__init__(k_max)
        self.k_max, self.decay, self.probe_every, self.forget_after = k_max, decay, probe_every, forget_after
        self.judged = [0.0] * (k_max + 1)  # per draft position, 1-based (index 0 unused)
        self.stood = [0.0] * (k_max + 1)
        self.costs: dict[int, tuple[float, float, int]] = {}  # drafts offered -> (drafting s, verifying s, call)
        self.first_call: dict[int, int] = {}  # drafts offered -> the call that first ran them
        self.calls = 0

    def observe(self, proposed: int, accepted: int, draft_s: float | None = None, verify_s: float | None = None) -> None:
        # A k's first call warms it up: its timings are not kept.
        if draft_s is not None and self.first_call.setdefault(proposed, self.calls) < self.calls:
            old, d = self.costs.get(proposed), self.decay
            self.costs[proposed] = ((draft_s, verify_s, self.calls) if old is None else
                                    (d * old[0] + (1 - d) * draft_s, d * old[1] + (1 - d) * verify_s, self.calls))
        # Each offered draft up to and including the first rejection was judged at its position.
        for j in range(1, min(accepted + 1, proposed, self.k_max) + 1):
            self.judged[j] = self.decay * self.judged[j] + 1
            self.stood[j] = self.decay * self.stood[j] + (j <= accepted)

    def tokens(self) -> list[float]:
        """Expected tokens of an iteration of k drafts (the target's own included), k = 0 .. k_max."""
        totals, reach, p = [1.0], 1.0, PRIOR_ACCEPT
        for j in range(1, self.k_max + 1):
            p = (self.stood[j] + PRIOR * p) / (self.judged[j] + PRIOR)
            reach *= min(p, 0.999)
            totals.append(totals[-1] + reach)
        return totals

    def cost(self, k: int) -> float:
        """Seconds of an iteration of k drafts, drafting and verifying: the measured figure, else the
        lines' through the k >= 1 measured (or in proportion to the one; k = 0: verifying only)."""
        if k in self.costs:
            return self.costs[k][0] + self.costs[k][1]
        drafted = sorted(j for j in self.costs if j > 0)
        if len(drafted) == 1:
            j = drafted[0]
            return self.costs[j][0] * k / j + self.costs[j][1] * (k + 1) / (j + 1)
        draft = _line(drafted, [self.costs[j][0] for j in drafted], k) if k else 0.0
        return max(draft, 0.0) + max(_line(drafted, [self.costs[j][1] for j in drafted], k), 1e-9)

    def next_k(self) -> int:
        self.calls += 1
        self.costs = {k: c for k, c in self.costs.items() if self.calls - c[2] <= self.forget_after}
        drafted = [k for k in self.costs if k > 0]
        if not drafted:
            self.k = self.k_max
        elif len(drafted) == 1 and self.k_max > 1:  # a second point for the lines
            self.k = drafted[0] // 2 if drafted[0] > 1 else 2
        else:
            tokens = self.tokens()
            rate = {k: tokens[k] / self.cost(k) for k in range(self.k_max + 1)}
            self.k = max(rate, key=rate.get)
            if 0 not in self.costs and PLAIN_DOUBT * rate[0] >= rate[self.k]:
                self.k = 0  # plain steps might win: measured, not taken from the lines
            if self.k == 0 and self.calls % self.probe_every == 0:
                return max(range(1, self.k_max + 1), key=rate.get)
        return self.k

    @property
    def label(self) -> str:
        return f"auto({self.k})"


def _line(xs: list[int], ys: list[float], x: int) -> float:
    """The least-squares line through (xs, ys) (two or more distinct xs), at x."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)
    return my + slope * (x - mx)


def spec_length(k: int | str | None, method: Method, proposer) -> SpecLength:
    """The schedule a config asks for: the method's fixed k if it has one (naive: 0), adaptive for
    "auto", else k. k None (no --gen-num-per-cycle) is the built proposer's own default where the
    method reads one from it (Method.default_k: a DFlash drafter's block size - 1), else DEFAULT_K;
    that own default is also auto's ceiling. Neither passes the most drafts the proposer can make
    (Method.max_k: a Medusa chain's heads), which a larger k is an error against."""
    if method.fixed_k is not None:
        return SpecLength(method.fixed_k)
    own = method.default_k(proposer) if method.default_k is not None else None
    most = method.max_k(proposer) if method.max_k is not None else None

    def capped(n: int) -> int:
        return n if most is None else min(n, most)

    if k == "auto":
        return AdaptiveSpecLength(k_max=capped(own or AUTO_K_MAX))
    if k is not None and most is not None and k > most:
        raise SpecliteError(f"--gen-num-per-cycle {k}: --sp-type {method.name} drafts at most {most} tokens an "
                            "iteration with this draft and these options")
    return SpecLength(k if k is not None else capped(own or DEFAULT_K))
