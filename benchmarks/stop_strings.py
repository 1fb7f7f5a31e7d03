"""What a stop string costs: held-out prompts without one, with one never met, and with one met early
or mid-answer, in one process, passes interleaved.

    python benchmarks/stop_strings.py --threads 2                 # plain decoding of the pair
    python benchmarks/stop_strings.py --threads 2 --sp-type pard  # with its parallel drafter

Each answer is first generated without a stop string; the "early" and "mid" stops are three of its
characters from character 5 and from its middle. Each pass times `LLM.generate` prompt by prompt; the
median of --passes is printed per case, with the tokens produced and the ratio to no stop. Against
another tree: run it with that tree first on PYTHONPATH, from a directory outside the repository.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import speclite
from speclite import LLM, SamplingParams

HELDOUT = Path(speclite.__file__).parent / "assets" / "heldout_prompts.jsonl"

DRAFTS = {"pard": "tiny-code-pard", "vanilla": "tiny-code-draft", "eagle3": "tiny-code-eagle3"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sp-type", choices=["none", *DRAFTS], default="none")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=20, help="the first N held-out prompts")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prompts = [json.loads(line)["prompt"] for line in HELDOUT.read_text().splitlines()][: args.prompts]
    config = (None if args.sp_type == "none" else
              {"method": args.sp_type, "model": DRAFTS[args.sp_type], "num_speculative_tokens": args.k})
    llm = LLM("tiny-code", config, device="cpu")
    plain = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    answers = [out.text for out in llm.generate(prompts, plain)]

    def stops(at):
        return [SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True, stop=[a[at(a):][:3]])
                for a in answers]

    cases = {"no stop": [plain] * len(prompts),
             "a stop never met": [SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True,
                                                 stop=["<<never>>"])] * len(prompts),
             "stop early": stops(lambda a: 5), "stop mid-answer": stops(lambda a: len(a) // 2)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    tokens = {}
    for _ in range(args.passes):
        for name, params in cases.items():
            start = time.perf_counter()
            tokens[name] = sum(len(llm.generate(p, q)[0].token_ids) for p, q in zip(prompts, params))
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["no stop"])
    print(f"tiny-code, {args.sp_type}{f' k={args.k}' if config else ''}, {len(prompts)} prompts, "
          f"at most {args.max_new_tokens} tokens, median of {args.passes} passes\n")
    print("| case | seconds | tokens | against no stop |")
    print("|---|---|---|---|")
    for name in cases:
        t = statistics.median(times[name])
        print(f"| {name} | {t:.3f} | {tokens[name]} | {t / base:.2f}x |")


if __name__ == "__main__":
    main()
