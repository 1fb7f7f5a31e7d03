"""Loop overhead: a speculative iteration's measured time minus the forward passes it must make.

With accept_all every iteration emits exactly k+1 tokens and makes the same passes: the target
forwards k+1 tokens once, the draft forwards 2 tokens (the target's token and the last draft,
fed back) and then k-1 single tokens. Those passes are timed on their own, with the same
callables (static or not), the same shapes and at the same context length; whatever else the
iteration costs (verification, rollback, bookkeeping, detokenising, Python) is the overhead.

An iteration's time is a difference of two runs of the same prompt, n tokens and one iteration's
worth, divided by the iterations between them: prefill and per-request costs cancel out.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from speclite.bench.runner import Runner, sync
from speclite.bench.sweep import BenchConfig
from speclite.sampling import SamplingParams
from speclite.speculate.draft_model import DraftModelProposer


@dataclass
class Overhead:
    label: str
    k: int
    iteration_s: float
    target_forward_s: float
    draft_forwards_s: float

    @property
    def forwards_s(self) -> float:
        return self.target_forward_s + self.draft_forwards_s

    @property
    def overhead_s(self) -> float:
        return self.iteration_s - self.forwards_s

    def as_dict(self) -> dict:
        return {"label": self.label, "k": self.k, "iteration_s": self.iteration_s,
                "target_forward_s": self.target_forward_s, "draft_forwards_s": self.draft_forwards_s,
                "forwards_s": self.forwards_s, "overhead_s": self.overhead_s,
                "overhead_share": self.overhead_s / self.iteration_s}


def time_forward(fn, cache, n_tokens: int, at_len: int, vocab: int, device, repeats: int, num_logits=None) -> float:
    """Median seconds of fn(n_tokens new tokens, cache) with `at_len` tokens already cached."""
    cache.rollback(0)
    fn(torch.randint(0, vocab, (at_len,), device=device), cache)  # fill the context (untimed)
    times = []
    for _ in range(repeats + 1):  # the first call may capture a CUDA graph: dropped
        tokens = torch.randint(0, vocab, (n_tokens,), device=device)
        sync(device)
        start = time.perf_counter()
        fn(tokens, cache, num_logits)
        sync(device)
        times.append(time.perf_counter() - start)
        cache.rollback(at_len)
    return statistics.median(times[1:])


def _iteration_time(runner: Runner, config: BenchConfig, n: int, per_iter: int, repeats: int) -> float:
    long_p = SamplingParams(max_new_tokens=n, ignore_eos=True)
    short_p = SamplingParams(max_new_tokens=per_iter, ignore_eos=True)
    runner.run_one(config, 0, long_p)  # warm-up
    diffs = []
    for _ in range(repeats):
        long_out, long_s = runner.run_one(config, 0, long_p)
        short_out, short_s = runner.run_one(config, 0, short_p)
        iters = long_out.stats.iter_count - short_out.stats.iter_count
        diffs.append((long_s - short_s) / iters)
    return statistics.median(diffs)


def measure(runner: Runner, ks: list[int], n: int, repeats: int) -> list[Overhead]:
    """Plain decoding, then vanilla under accept_all at each k (n is rounded to whole iterations)."""
    llm = next(iter(runner.models.llms.values()))
    device, vocab = runner.device, llm.target.args.vocab_size
    prompt_len = len(runner.inputs[None][0][0])
    with torch.inference_mode():
        results = []
        plain = BenchConfig("plain", 0, None)
        at = prompt_len + n // 2
        step = time_forward(llm.engine.target, llm.engine.cache, 1, at, vocab, device, repeats * 5)
        results.append(Overhead("plain", 0, _iteration_time(runner, plain, n, 1, repeats), step, 0.0))
        proposer = runner.proposers["vanilla", None]
        assert isinstance(proposer, DraftModelProposer)
        for k in ks:
            config = BenchConfig("vanilla", k, None, "accept_all")
            iters = max(2, n // (k + 1))
            target_s = time_forward(llm.engine.target, llm.engine.cache, k + 1, at, vocab, device, repeats * 5)
            two = time_forward(proposer.model, proposer.cache, 2, at, vocab, device, repeats * 5, num_logits=1)
            one = time_forward(proposer.model, proposer.cache, 1, at, vocab, device, repeats * 5, num_logits=1)
            iteration = _iteration_time(runner, config, iters * (k + 1), k + 1, repeats)
            results.append(Overhead(config.label, k, iteration, target_s, two + (k - 1) * one))
    llm.engine.reset()
    proposer.reset()  # time_forward wrote into both caches directly
    return results
