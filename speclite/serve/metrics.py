"""GET /metrics: request outcomes and speculation totals in the Prometheus text format."""

from __future__ import annotations

import threading
from collections import Counter

from speclite.engine.stats import RequestStats

OUTCOMES = ("ok", "cancelled", "invalid", "rejected", "failed")


class Metrics:
    """Totals over every request served, updated by the engine thread and the request handlers."""

    def __init__(self):
        self._lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.stats = RequestStats()

    def count(self, outcome: str) -> None:
        with self._lock:
            self.outcomes[outcome] += 1

    def finished(self, result, cancelled: bool) -> None:
        with self._lock:
            self.outcomes["cancelled" if cancelled else "ok"] += 1
            self.prompt_tokens += result.prompt_len
            self.stats.merge(result.stats)

    def collector(self, queue_depth, running):
        """A prometheus_client collector reading these totals (and the live queue) at each scrape."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        metrics = self

        class Collector:
            def collect(self):
                with metrics._lock:
                    s = metrics.stats
                    requests = CounterMetricFamily("speclite_requests", "Requests by outcome.", labels=["outcome"])
                    for outcome in OUTCOMES:
                        requests.add_metric([outcome], metrics.outcomes[outcome])
                    yield requests
                    yield CounterMetricFamily("speclite_prompt_tokens", "Prompt tokens of finished requests.",
                                              value=metrics.prompt_tokens)
                    yield CounterMetricFamily("speclite_generation_tokens", "Tokens generated.", value=s.output_len)
                    yield CounterMetricFamily("speclite_iterations", "Decode iterations (one target pass each).",
                                              value=s.iter_count)
                    yield GaugeMetricFamily("speclite_tokens_per_iteration", "Generated tokens per iteration, "
                                            "over all requests.", value=s.avg_tokens_per_iter)
                    proposed = CounterMetricFamily("speclite_draft_tokens", "Draft tokens proposed, by draft "
                                                   "position (1 = first).", labels=["position"])
                    accepted = CounterMetricFamily("speclite_accepted_draft_tokens", "Draft tokens accepted, by "
                                                   "draft position.", labels=["position"])
                    rate = GaugeMetricFamily("speclite_acceptance_rate", "Accepted / proposed drafts, by draft "
                                             "position.", labels=["position"])
                    for i, (p, a) in enumerate(zip(s.proposed_at, s.accepted_at), start=1):
                        proposed.add_metric([str(i)], p)
                        accepted.add_metric([str(i)], a)
                        rate.add_metric([str(i)], a / p if p else 0.0)
                    yield from (proposed, accepted, rate)
                yield GaugeMetricFamily("speclite_queue_depth", "Requests waiting for the engine.", value=queue_depth())
                yield GaugeMetricFamily("speclite_running", "Requests being generated (0 or 1).", value=running())

        return Collector()
