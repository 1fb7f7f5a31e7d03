"""speclite next to transformers on the same model, prompts and settings, in the same run.

    python benchmarks/peers.py --model tiny-code --k 4 --threads 1
    python benchmarks/peers.py --synthetic qwen2.5-1.5b --synthetic-draft qwen2.5-0.5b --layers 4
    python benchmarks/peers.py --synthetic qwen2.5-7b --synthetic-draft qwen2.5-0.5b --device cuda

Contestants (greedy, same prompt ids, same max_new_tokens):
  speclite plain / vanilla k / deterministic k (the bench's runner), and transformers'
  generate plain / assisted (assistant_model=, num_assistant_tokens=k, constant schedule) /
  prompt lookup (prompt_lookup_num_tokens=k, max_matching_ngram_size=--max-match).
For each repeat every contestant runs all prompts (interleaved); tokens/s is the median over
repeats. Reported: each contestant's speedup over its own plain decoding, and the ratios
speclite / transformers for each pair (plain, draft model, prompt lookup). Where the draft's
vocabulary is padded to another size, transformers only accepts it through universal assisted
decoding (tokenizer= and assistant_tokenizer=), which is said in the output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from speclite import hub
from speclite.bench.prompts import load_prompts
from speclite.bench.runner import BenchModels, Runner, sync
from speclite.bench.sweep import BenchConfig
from speclite.model.loader import resolve_device, resolve_dtype


class HFContestant:
    def __init__(self, name, model, runner, n, ignore_eos, **kwargs):
        self.name, self.model, self.runner, self.kwargs = name, model, runner, kwargs
        self.tokenizer = next(iter(runner.models.llms.values())).tokenizer
        self.kwargs.update(max_new_tokens=n, do_sample=False, pad_token_id=self.tokenizer.pad_token_id or 0)
        if ignore_eos:
            self.kwargs["min_new_tokens"] = n

    def __call__(self, index):
        ids = torch.tensor([self.runner.inputs[None][index][0]], device=self.runner.device)
        sync(self.runner.device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **self.kwargs)
        sync(self.runner.device)
        return out[0, ids.shape[1]:].tolist(), time.perf_counter() - start


class SpecliteContestant:
    def __init__(self, name, config, runner):
        self.name, self.config, self.runner = name, config, runner

    def __call__(self, index):
        out, seconds = self.runner.run_one(self.config, index, self.runner.params)
        return out.token_ids, seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model")
    src.add_argument("--synthetic")
    ap.add_argument("--draft", help="default: models.toml's recommended draft")
    ap.add_argument("--synthetic-draft", default="qwen2.5-0.5b")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-match", type=int, default=3, help="n-gram size for both prompt lookups")
    ap.add_argument("--prompts", default="builtin")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    out = Console(width=150)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="speclite-peers-") as tmp:
        if args.synthetic:
            from speclite.bench.synthetic import build_pair

            target, draft, _ = build_pair(Path(tmp), args.synthetic, args.synthetic_draft, args.layers, dtype, device=device)
        else:
            target, draft = args.model, args.draft or hub.recommended_draft(args.model, method="vanilla")
        target_dir, draft_dir = hub.resolve(target), hub.resolve(draft)
        k, n, ignore_eos = args.k, args.max_new_tokens, bool(args.synthetic)
        configs = [BenchConfig("plain", 0, None), BenchConfig("vanilla", k, None, draft=str(draft_dir)),
                   BenchConfig("deterministic", k, None)]
        models = BenchModels.load(str(target_dir), [str(draft_dir)], [None], device=device, dtype=dtype)
        runner = Runner(models, configs, load_prompts(args.prompts), n, ignore_eos=ignore_eos,
                        method_options={"max_match": args.max_match})
        hf_target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype).to(device).eval()
        hf_draft = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=dtype).to(device).eval()
        universal = hf_target.config.vocab_size != hf_draft.config.vocab_size
        assisted = dict(assistant_model=hf_draft, num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
                        assistant_confidence_threshold=0.0)
        if universal:
            assisted.update(tokenizer=runner.models.llms[None].tokenizer, assistant_tokenizer=runner.models.llms[None].tokenizer)
        contestants = [
            SpecliteContestant("speclite plain", configs[0], runner),
            HFContestant("transformers plain", hf_target, runner, n, ignore_eos),
            SpecliteContestant(f"speclite vanilla k={k}", configs[1], runner),
            HFContestant(f"transformers assisted k={k}", hf_target, runner, n, ignore_eos, **assisted),
            SpecliteContestant(f"speclite deterministic k={k}", configs[2], runner),
            HFContestant(f"transformers prompt lookup k={k}", hf_target, runner, n, ignore_eos,
                         prompt_lookup_num_tokens=k, max_matching_ngram_size=args.max_match),
        ]
        for c in contestants:  # warm-up
            c(0)
        tps = {c.name: [] for c in contestants}
        ids: dict[str, list] = {}
        for r in range(args.repeats):
            for c in contestants if r % 2 == 0 else contestants[::-1]:
                tokens, seconds = 0, 0.0
                for i in range(len(runner.prompts)):
                    out_ids, s = c(i)
                    tokens, seconds = tokens + len(out_ids), seconds + s
                    ids.setdefault(c.name, []).append(out_ids)
                tps[c.name].append(tokens / seconds)
    med = {name: statistics.median(v) for name, v in tps.items()}
    reference = ids["speclite plain"]
    names = [c.name for c in contestants]
    table = Table(title=f"{target} + draft {draft} | {device.type} {str(dtype).removeprefix('torch.')}, "
                        f"{torch.get_num_threads()} threads | {len(runner.prompts)} prompts x {n} tokens | median of "
                        f"{args.repeats} interleaved repeats", title_justify="left")
    for col in ("contestant", "tok/s", "speedup over own plain", "speclite / transformers", "same tokens as speclite plain"):
        table.add_column(col, justify="left" if col == "contestant" else "right")
    rows = []
    for i, name in enumerate(names):
        own_plain = med[names[0]] if name.startswith("speclite") else med[names[1]]
        ratio = med[name] / med[names[i + 1]] if i % 2 == 0 else None
        same = sum(a == b[: len(a)] or b == a[: len(b)] for a, b in zip(ids[name], reference))
        rows.append({"name": name, "tokens_per_s": med[name], "tokens_per_s_runs": tps[name],
                     "speedup_over_own_plain": med[name] / own_plain, "speclite_over_transformers": ratio,
                     "same_as_speclite_plain": same, "runs": len(reference)})
        table.add_row(name, f"{med[name]:.1f}", f"{med[name] / own_plain:.2f}x", f"{ratio:.2f}x" if ratio else "",
                      f"{same}/{len(reference)}")
    out.print(table)
    if universal:
        out.print("note: draft vocabulary differs in size: transformers ran universal assisted decoding")
    out.print("ratios are within this run; absolute tokens/s vary with machine load")
    if args.json:
        args.json.write_text(json.dumps({"k": k, "max_new_tokens": n, "repeats": args.repeats, "universal_assisted": universal,
                                         "device": device.type, "threads": torch.get_num_threads(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
