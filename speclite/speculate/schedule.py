"""How many drafts to ask for each iteration: a fixed k, or k adapted to measured acceptance and cost."""

from __future__ import annotations

from speclite.speculate.registry import Method

DEFAULT_K = 4  # drafts per iteration when neither --gen-num-per-cycle nor the method gives a number
AUTO_K_MAX = 8  # auto's ceiling for a method without a default k of its own


class SpecLength:
    """A fixed k."""

    def __init__(self, k: int):
        self.k = k

    def next_k(self) -> int:
        return self.k

    def observe(self, proposed: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """One iteration: `accepted` of `proposed` drafts stood; drafting and verifying took these seconds."""

    @property
    def label(self) -> str:
        return str(self.k)


class AdaptiveSpecLength(SpecLength):
    """k that maximises expected tokens per second from the measured figures.

    With a per-draft acceptance rate a (an exponential moving average), k drafts yield
    (1 - a^(k+1)) / (1 - a) tokens per iteration and cost k draft steps plus one verify pass, both
    timed; a parallel draft (`flat_draft`) costs one draft forward whatever k. k = 0 (plain
    decoding) wins where speculation cannot pay; then a one-draft probe every `probe_every`
    iterations keeps the estimates fresh so speculation can come back.
    """

    def __init__(self, k_max: int = AUTO_K_MAX, decay: float = 0.8, probe_every: int = 16, flat_draft: bool = False):
        super().__init__(k_max)
        self.k_max, self.decay, self.probe_every, self.flat_draft = k_max, decay, probe_every, flat_draft
        self.accept = 0.7  # optimistic start: speculate until measured otherwise
        self.draft_step_s: float | None = None  # per draft, or per iteration when flat_draft
        self.verify_s: float | None = None
        self.since_probe = 0

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new

    def observe(self, proposed: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.verify_s = self._ema(self.verify_s, verify_s)
        if proposed:
            self.draft_step_s = self._ema(self.draft_step_s, draft_s if self.flat_draft else draft_s / proposed)
            # Acceptance of each offered draft up to and including the first rejection.
            offered = min(accepted + 1, proposed)
            for i in range(offered):
                self.accept = self._ema(self.accept, 1.0 if i < accepted else 0.0)
        self.k = self._best_k()

    def _best_k(self) -> int:
        if self.draft_step_s is None or self.verify_s is None:
            return self.k_max
        a = min(self.accept, 0.999)
        best_k, best_rate = 0, 1.0 / self.verify_s
        for k in range(1, self.k_max + 1):
            draft_s = self.draft_step_s if self.flat_draft else k * self.draft_step_s
            rate = ((1 - a ** (k + 1)) / (1 - a)) / (draft_s + self.verify_s)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def next_k(self) -> int:
        if self.k == 0:
            self.since_probe += 1
            if self.since_probe >= self.probe_every:
                self.since_probe = 0
                return 1
        return self.k

    @property
    def label(self) -> str:
        return f"auto({self.k})"


def spec_length(k: int | str | None, method: Method, proposer) -> SpecLength:
    """The schedule a config asks for: the method's fixed k if it has one (naive: 0), adaptive for
    "auto", else k. k None (no --gen-num-per-cycle) is the built proposer's own default where the
    method reads one from it (Method.default_k: a DFlash drafter's block size - 1), else DEFAULT_K;
    that own default is also auto's ceiling."""
    if method.fixed_k is not None:
        return SpecLength(method.fixed_k)
    own = method.default_k(proposer) if method.default_k is not None else None
    if k == "auto":
        return AdaptiveSpecLength(k_max=own or AUTO_K_MAX, flat_draft=method.flat_draft_cost)
    return SpecLength(k if k is not None else own or DEFAULT_K)
