"""The model-free proposers' own cost: time per iteration at long contexts, and suffix cache memory.

    python benchmarks/proposer_cost.py --threads 2

For each context length (1k, 8k, 32k tokens of the Python text speclite ships, tokenized with
tiny-code's tokenizer) both `suffix` and `deterministic` (prompt lookup) start a request on the
context, then run --iters iterations of propose(k) + observe(the tokens that really follow, as
verification would accept them). The suffix proposer's cache of earlier responses holds
--cached-tokens tokens of other text. Reported: the median propose+observe time per iteration,
the request start (begin, plus prompt lookup's first, indexing, proposal), and, in the same run,
one decode step of a Qwen2.5-0.5B-shaped model (random weights) at 8k tokens of KV cache, in bf16
and in float32: the faster of the two is the yardstick the per-iteration cost is compared with
(on a CPU without native bf16, float32 is the faster). Last, the memory the suffix cache takes
per 1M cached tokens (tracemalloc while inserting --memory-tokens tokens as 256-token responses).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import torch

import speclite
from speclite import hub
from speclite.model.tokenizer import load_tokenizer
from speclite.sampling import SamplingParams, make_generator
from speclite.model import load_model
from speclite.speculate.base import RequestContext
from speclite.speculate.prompt_lookup import PromptLookupProposer
from speclite.speculate.suffix import SuffixProposer
from speclite.speculate.suffix_cache import ResponseCache
from speclite.synthetic import build_synthetic

CONTEXTS = (1024, 8192, 32768)


def corpus_tokens(n: int) -> list[int]:
    """n tokens of real text: the calibration files speclite ships, repeated as needed."""
    data = Path(speclite.__file__).parent / "data"
    text = "\n".join(p.read_text() for p in sorted(data.glob("*.txt")))
    ids = load_tokenizer(hub.resolve("tiny-code")).encode(text)
    return (ids * (n // len(ids) + 1))[:n]


def time_proposer(proposer, context: list[int], future: list[int], k: int, iters: int) -> tuple[float, float, float]:
    """(seconds to start the request and make its first proposal, median seconds per iteration after,
    tokens per iteration: the observe() share of an iteration's cost grows with it)."""
    ctx = RequestContext(SamplingParams(), make_generator(0, torch.device("cpu")), torch.device("cpu"))
    start = time.perf_counter()
    proposer.begin(context, ctx)
    drafts = proposer.propose(k).tokens
    setup = time.perf_counter() - start
    times, pos = [], 0
    for _ in range(iters):
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == future[pos + accepted]:
            accepted += 1
        new = future[pos : pos + accepted + 1]
        pos += len(new)
        start = time.perf_counter()
        proposer.observe(new)
        drafts = proposer.propose(k).tokens
        times.append(time.perf_counter() - start)
    return setup, statistics.median(times), pos / iters


def decode_step_seconds(model_dir: Path, dtype: torch.dtype, context: int, repeats: int) -> float:
    """One single-token forward of the model in `dtype` over `context` cached tokens (median)."""
    model = load_model(model_dir, device="cpu", dtype=dtype)
    cache = model.new_cache(context + 8)
    cache.length = context  # the attention reads `context` entries; their values do not change the time
    times = []
    with torch.inference_mode():
        for i in range(repeats + 1):
            start = time.perf_counter()
            model(torch.tensor([i + 1]), cache)
            times.append(time.perf_counter() - start)
            cache.rollback(context)
    return statistics.median(times[1:])


def cache_bytes_per_million(tokens: list[int], depth: int) -> float:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cache = ResponseCache(depth, -1)
    for i in range(0, len(tokens), 256):
        cache.add(tokens[i : i + 256])
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used / len(tokens) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--cached-tokens", type=int, default=65536)
    ap.add_argument("--memory-tokens", type=int, default=200_000)
    ap.add_argument("--config", default="qwen2.5-0.5b")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    longest = max(CONTEXTS) + 4 * args.iters * (args.k + 1)
    tokens = corpus_tokens(longest + args.cached_tokens)
    earlier, text = tokens[:args.cached_tokens], tokens[args.cached_tokens:]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_synthetic(args.config, tmp)
        steps = {str(d).removeprefix("torch."): decode_step_seconds(model_dir, d, 8192, args.repeats)
                 for d in (torch.bfloat16, torch.float32)}
    for name, seconds in steps.items():
        print(f"{args.config} {name} decode step at 8k context: {seconds * 1e3:.1f} ms")
    step = min(steps.values())  # the stricter yardstick: whichever dtype is faster on this CPU
    print("| context | method | start (ms) | per iteration (us) | tokens / iteration | % of the faster 8k decode step |")
    print("|---|---|---|---|---|---|")
    for n in CONTEXTS:
        context, future = text[:n], text[n:]
        suffix = SuffixProposer(4096)
        for i in range(0, len(earlier), 256):
            suffix.responses.add(earlier[i : i + 256])
        for name, proposer in (("suffix", suffix), ("deterministic", PromptLookupProposer(1, 3))):
            setup, per_iter, per_iter_tokens = time_proposer(proposer, context, future, args.k, args.iters)
            print(f"| {n} | {name} | {setup * 1e3:.1f} | {per_iter * 1e6:.0f} | {per_iter_tokens:.2f} "
                  f"| {100 * per_iter / step:.3f} |")
    per_m = cache_bytes_per_million(tokens[: args.memory_tokens], 64)
    print(f"suffix cache memory: {per_m / 2**20:.0f} MiB per 1M cached tokens (depth 64, "
          f"measured over {args.memory_tokens} tokens)")


if __name__ == "__main__":
    main()
