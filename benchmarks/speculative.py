"""Plain vs speculative tokens/s side by side in one run, then the loop overhead under accept_all.

    python benchmarks/speculative.py --model tiny-code                      # draft from models.toml
    python benchmarks/speculative.py --model T --draft D --k 2,4 --threads 1
    python benchmarks/speculative.py --synthetic qwen2.5-7b --synthetic-draft qwen2.5-0.5b \
        --device cuda --static --k 2,4,8                                     # GPU, real shapes

Part 1 is `speclite bench` (same code): plain, naive, vanilla and deterministic on the built-in
prompts, interleaved repeats, speedup = ratio within the run. Part 2 times one speculative
iteration under accept_all (exactly k+1 tokens) and, separately, the forward passes it is made of
(the target's k+1-token pass, the draft's 2-token and k-1 one-token passes, same shapes and
context), and reports overhead = iteration time - forward times; plain decoding likewise.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from speclite import hub
from speclite.bench.overhead import measure
from speclite.bench.prompts import load_prompts
from speclite.bench.report import results_table, roofline_lines
from speclite.bench.runner import BenchModels, Runner
from speclite.bench.session import BenchOptions, run_bench
from speclite.bench.sweep import build_sweep, parse_ks
from speclite.model.loader import resolve_device, resolve_dtype


def overhead_table(rows) -> Table:
    table = Table(title="loop overhead (accept_all: k+1 tokens per iteration)", title_justify="left")
    for col in ("configuration", "iteration ms", "target fwd ms", "draft fwds ms", "overhead ms", "overhead share"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for r in rows:
        table.add_row(r.label, f"{r.iteration_s * 1e3:.2f}", f"{r.target_forward_s * 1e3:.2f}",
                      f"{r.draft_forwards_s * 1e3:.2f}", f"{r.overhead_s * 1e3:.2f}", f"{r.overhead_s / r.iteration_s:.0%}")
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model")
    src.add_argument("--synthetic", help="shipped config name (qwen2.5-7b, ...) or a config.json")
    ap.add_argument("--draft", help="default: models.toml's recommended draft")
    ap.add_argument("--synthetic-draft", default="qwen2.5-0.5b")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--k", default="2,4")
    ap.add_argument("--prompts", default="builtin")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--static", action="store_true", help="CUDA graphs for fixed-shape steps")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    out = Console(width=150)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="speclite-spec-") as tmp:
        if args.synthetic:
            from speclite.bench.synthetic import build_pair

            target, draft, _ = build_pair(Path(tmp), args.synthetic, args.synthetic_draft, args.layers, dtype, device=device)
            target, draft = str(target), str(draft)
        else:
            target, draft = args.model, args.draft or hub.recommended_draft(args.model, method="vanilla")
        common = dict(model=target, draft=draft, ks=args.k, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                      repeats=args.repeats, device=args.device, dtype=args.dtype, static=args.static,
                      ignore_eos=bool(args.synthetic))
        result = run_bench(BenchOptions(sp_types="naive,vanilla,deterministic", **common))
        meta = result["meta"]
        name = f"synthetic {args.synthetic} + {args.synthetic_draft}" if args.synthetic else f"{target} + {draft}"
        out.print(results_table(result["configs"], f"{name} | {meta['device']} {meta['dtype']}, {meta['threads']} "
                                f"threads | {len(meta['prompts'])} prompts x {args.max_new_tokens} tokens | median of "
                                f"{args.repeats}", meta["memory_kind"]))
        for line in roofline_lines(result["rooflines"]):
            out.print(line)

        ks = [k for k in parse_ks(args.k) if k != "auto"]
        models = BenchModels.load(target, [draft], [None], device=device, dtype=dtype, static=args.static)
        configs = build_sweep(["vanilla"], ks, [None], "accept_all", {"vanilla": draft})
        runner = Runner(models, configs, load_prompts(args.prompts)[:1], args.max_new_tokens, ignore_eos=True)
        rows = measure(runner, ks, args.max_new_tokens, args.repeats)
        out.print(overhead_table(rows))
        out.print(f"prompt '{runner.prompts[0].name}' ({len(runner.inputs[None][0][0])} tokens); forwards timed at "
                  f"context {len(runner.inputs[None][0][0]) + args.max_new_tokens // 2}")
    if args.json:
        result["overhead"] = [r.as_dict() for r in rows]
        args.json.write_text(json.dumps(result, indent=1))
        out.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
