"""Decode speed with and without a busy neighbour process, per OpenMP wait setting, interleaved.

    python benchmarks/threads.py --rounds 3            # tiny-code, float32, 64 tokens
    python benchmarks/threads.py --model /path/to/dir --dtype bfloat16 --quant int4
    python benchmarks/threads.py --spins 1000,30000 --method pard --draft tiny-code-pard
    python benchmarks/threads.py --neighbour every-cpu --method eagle3 --draft tiny-code-eagle3

Each measurement is a fresh process (libgomp reads its settings once, when torch loads it). The
neighbour is one pure-Python busy loop, the way a compiler or a second job shares a laptop. Rows:
speclite's default (GOMP_SPINCOUNT=1000), libgomp's own default (OMP_WAIT_POLICY unset, spinning
~300k iterations), and OMP_WAIT_POLICY=passive; with and without the neighbour; median tok/s.
`--neighbour every-cpu` makes it one busy loop per CPU at nice 10 instead (a niced build or training
job holding every core: where the kernels' team had each call wait for a worker on a shared core).
`--spins` replaces the first row by one row per GOMP_SPINCOUNT value; `--method` / `--draft` decode
speculatively (k=4).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

# name -> (environment, import torch before speclite: libgomp then starts with its own default)
SETTINGS = {"speclite (GOMP_SPINCOUNT=1000)": ({}, False), "libgomp default": ({}, True),
            "passive": ({"OMP_WAIT_POLICY": "passive"}, False)}

MEASURE = """
import time
{torch_first}
from speclite import LLM, SamplingParams
llm = LLM({model!r}, {spec!r}, dtype={dtype!r}, quant={quant!r})
params = SamplingParams(max_new_tokens={tokens}, ignore_eos=True)
llm.generate("def f(x):", SamplingParams(max_new_tokens=4))
start = time.perf_counter()
out = llm.generate("def binary_search(items, target):", params)[0]
print(len(out.token_ids) / (time.perf_counter() - start))
"""


def measure(args, setting: tuple[dict, bool]) -> float:
    extra, torch_first = setting
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(extra)
    spec = {"method": args.method, "model": args.draft, "num_speculative_tokens": 4} if args.method else None
    code = MEASURE.format(torch_first="import torch" if torch_first else "", model=args.model, dtype=args.dtype,
                          quant=args.quant, tokens=args.tokens, spec=spec)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-code")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--quant", default=None)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--spins", default=None, help="comma list of GOMP_SPINCOUNT values, each a row")
    p.add_argument("--method", default=None, help="a speculative method (k=4)")
    p.add_argument("--draft", default=None, help="the method's draft")
    p.add_argument("--neighbour", choices=("one", "every-cpu"), default="one",
                   help="one busy loop, or one per CPU at nice 10")
    args = p.parse_args()
    settings = dict(SETTINGS)
    if args.spins:
        del settings[next(iter(SETTINGS))]
        settings = {f"GOMP_SPINCOUNT={n}": ({"GOMP_SPINCOUNT": n}, False) for n in args.spins.split(",")} | settings
    results: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.rounds):
        for busy in (False, True):
            loop = [sys.executable, "-c", "while True: pass"]
            count = (os.cpu_count() if args.neighbour == "every-cpu" else 1) if busy else 0
            niced = ["nice", "-n", "10"] if args.neighbour == "every-cpu" else []
            neighbours = [subprocess.Popen(niced + loop) for _ in range(count)]
            try:
                for name, setting in settings.items():
                    results.setdefault((name, busy), []).append(measure(args, setting))
            finally:
                for neighbour in neighbours:
                    neighbour.kill()
                    neighbour.wait()
    print(f"{args.model} {args.dtype} quant={args.quant} {args.method or 'plain'}, {args.tokens} tokens, "
          f"{os.cpu_count()} CPUs, neighbour: {args.neighbour}, median of {args.rounds} rounds (tok/s)")
    print("| OpenMP wait | idle | busy neighbour | busy / idle |")
    print("|---|---|---|---|")
    for name in settings:
        idle, busy = (statistics.median(results[(name, b)]) for b in (False, True))
        print(f"| {name} | {idle:.1f} | {busy:.1f} | {busy / idle:.2f} |")


if __name__ == "__main__":
    main()
