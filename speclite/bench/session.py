"""One whole bench: build or resolve the models, warm up, run interleaved, summarise.

Both `speclite bench` and benchmarks/*.py go through run_bench(), so every number they print
comes from the same timing code.
"""

from __future__ import annotations

import os
import platform
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from speclite import hub
from speclite.bench.memory import process_peak_rss_bytes
from speclite.bench.prompts import load_prompts
from speclite.bench.report import summarise
from speclite.bench.roofline import copy_bandwidth, roofline
from speclite.bench.runner import BenchModels, Runner
from speclite.bench.sweep import build_sweep, parse_ks, parse_maps, parse_methods, parse_quants
from speclite.engine.memory import step_bytes
from speclite.errors import SpecliteError
from speclite.model.loader import read_config, resolve_device, resolve_dtype
from speclite.sampling import SamplingParams
from speclite.speculate import METHODS, get_method


@dataclass
class BenchOptions:
    model: str | None = None
    draft: str | None = None
    sp_types: str | None = None  # comma list; None: every default-sweep method whose draft is known (or needs none)
    ks: str | None = None  # comma list; None: each method's own default k
    quants: str | None = None
    draft_quant: str | None = None
    accept_policy: str = "normal"
    prompts: str = "builtin"
    max_new_tokens: int = 64
    repeats: int = 3
    device: str = "auto"
    dtype: str = "auto"
    max_model_len: int | None = None
    method_options: dict = field(default_factory=dict)  # registry option name -> value (e.g. min_match)
    ignore_eos: bool = False
    temperature: float = 0.0  # > 0: sampled runs (rejection sampling), each prompt seeded by its index
    top_p: float = 1.0
    top_k: int = 0
    synthetic: str | None = None
    synthetic_draft: str | None = None
    layers: int | None = None
    draft_layers: int | None = None
    static: bool = False  # CUDA graphs for the fixed-shape decode / verify / draft steps
    threads: int | None = None  # torch CPU threads; 1 is steadier on a shared, oversubscribed machine
    models_file: str | None = None
    extra_meta: dict = field(default_factory=dict)


def check_options(o: BenchOptions) -> None:
    """Invalid combinations fail here, before anything is built or loaded."""
    if (o.model is None) == (o.synthetic is None):
        raise SpecliteError("give exactly one of --model and --synthetic")
    if o.synthetic_draft and not o.synthetic:
        raise SpecliteError("--synthetic-draft needs --synthetic")
    if o.synthetic and o.draft:
        raise SpecliteError("with --synthetic the draft is --synthetic-draft, not --draft")
    if (o.layers or o.draft_layers) and not o.synthetic:
        raise SpecliteError("--layers shrinks --synthetic models only")
    if o.repeats < 1:
        raise SpecliteError(f"--repeats must be at least 1, got {o.repeats}")
    if o.max_new_tokens < 1:
        raise SpecliteError(f"--max-new-tokens must be at least 1, got {o.max_new_tokens}")
    if any(n is not None and n < 1 for n in (o.layers, o.draft_layers)):
        raise SpecliteError("--layers must be at least 1")
    if o.threads is not None and o.threads < 1:
        raise SpecliteError(f"--threads must be at least 1, got {o.threads}")
    SamplingParams(max_new_tokens=o.max_new_tokens, temperature=o.temperature, top_p=o.top_p, top_k=o.top_k)


def _drafts_for(o: BenchOptions, draft: str | None, methods: list[str]) -> dict[str, str | None]:
    """Each method's draft: the one given (--draft, --synthetic-draft) for every method that takes a
    draft, else models.toml's recommendation for that method."""
    if o.synthetic or draft:
        return {m: draft if get_method(m).takes_draft else None for m in methods}
    return {m: hub.recommended_draft(o.model, o.models_file, get_method(m).recommends(o.method_options or {}))
            for m in methods}


def _random_drafts(o: BenchOptions, target_dir: Path, root: Path, dtype, device,
                   methods: list[str]) -> dict[str, Path]:
    """With --synthetic: a random draft of the published shape for each method whose draft is not a
    decoder and that can write one (an EAGLE-3 or Medusa head, a DFlash drafter, an MTP module),
    drawn on the run's device as the target is; the others run with --synthetic-draft."""
    target_cfg, made = read_config(target_dir), {}
    for m in methods:
        method = get_method(m)
        if method.random_draft is not None and not method.loads_draft_model(o.method_options or {}, None):
            made[m] = root / f"{m}-draft"
            method.random_draft(target_cfg, made[m], dtype, o.draft_layers or o.layers, device)
    return made


def run_bench(o: BenchOptions, on_start=None, on_run=None) -> dict:
    """Everything measured, as the JSON document `speclite bench --json` writes."""
    check_options(o)
    threads = torch.get_num_threads()
    if o.threads:
        torch.set_num_threads(o.threads)
    try:
        return _run(o, on_start, on_run)
    finally:
        torch.set_num_threads(threads)


def _run(o: BenchOptions, on_start, on_run) -> dict:
    prompts = load_prompts(o.prompts)
    ks = parse_ks(o.ks)
    quants = parse_quants(o.quants)
    methods = parse_methods(o.sp_types) if o.sp_types else []
    device = resolve_device(o.device)
    dtype = resolve_dtype(o.dtype, device)
    with tempfile.TemporaryDirectory(prefix="speclite-bench-") as tmp:
        model, draft, tokenizer_source = o.model, o.draft, None
        if o.synthetic:
            from speclite.bench.synthetic import build_pair

            target_dir, draft_dir, tokenizer_source = build_pair(
                Path(tmp), o.synthetic, o.synthetic_draft, o.layers, dtype, o.draft_layers or o.layers, device)
            model, draft = str(target_dir), (str(draft_dir) if draft_dir else None)
        drafts = _drafts_for(o, draft, methods or [m.name for m in METHODS.values() if m.in_default_sweep])
        labels = {draft: f"synthetic {o.synthetic_draft}"} if o.synthetic and draft else {}  # not a temporary path
        if o.synthetic:
            for m, made in _random_drafts(o, target_dir, Path(tmp), dtype, device, list(drafts)).items():
                drafts[m] = str(made)
                labels[str(made)] = f"random {m} draft"
        if not o.sp_types:
            methods = [m for m, d in drafts.items() if d or not get_method(m).needs_draft]
        missing = [m for m in methods if get_method(m).needs_draft and drafts[m] is None]
        if missing:
            raise SpecliteError(f"--sp-type {missing[0]} needs a draft: pass --draft (or --synthetic-draft); "
                                f"models.toml recommends none for it with '{model}'")
        unused = [flag for flag, value in (("--draft", o.draft), ("--synthetic-draft", o.synthetic_draft),
                                           ("--draft-quant", o.draft_quant)) if value]
        if unused and not any(get_method(m).takes_draft for m in methods):
            raise SpecliteError(f"{unused[0]} is not used by --sp-type {','.join(methods) or 'plain'}: no method there has a draft")
        maps = parse_maps((o.method_options or {}).get("token_map"))  # a list here: rows side by side
        configs = build_sweep(methods, ks, quants, o.accept_policy, drafts, maps)
        used: dict[str, list[str]] = {}  # draft -> the methods that run with it; each is loaded once
        for m in methods:
            if drafts[m]:
                used.setdefault(drafts[m], []).append(m)
        models = BenchModels.load(model, list(used), quants, device=device, dtype=dtype, draft_quant=o.draft_quant,
                                  models_file=o.models_file, max_model_len=o.max_model_len, static=o.static,
                                  draft_is_model=lambda d, d_dir: any(
                                      get_method(m).loads_draft_model(o.method_options or {}, d_dir) for m in used[d]))
        params = SamplingParams(max_new_tokens=o.max_new_tokens, ignore_eos=o.ignore_eos or bool(o.synthetic),
                                temperature=o.temperature, top_p=o.top_p, top_k=o.top_k)
        runner = Runner(models, configs, prompts, params, method_options=o.method_options)
        if on_start:
            on_start(len(configs) * len(prompts) * o.repeats)
        runner.warm_up()
        records = runner.run(o.repeats, on_run)
        peak_rss = process_peak_rss_bytes()
        rows = summarise(runner.configs, records, runner.peak_bytes)
        shown = {d: labels.get(d, d) for d in used}
        for row in rows:
            row["draft"] = shown.get(row["draft"])
        bandwidth = copy_bandwidth(device)
        rooflines = {}
        for quant, llm in models.llms.items():
            plain = next(r for r in rows if r["method"] == "plain" and r["quant"] == quant)
            rooflines[quant or ""] = roofline(step_bytes(llm.target), bandwidth, plain["step_s"])
    meta = {
        "model": o.synthetic and f"synthetic {o.synthetic}" or o.model,
        "draft": ", ".join(shown.values()) or None,  # every draft the run used; each row names its own
        "drafts": {m: shown[d] for d, ms in used.items() for m in ms},
        "draft_quant": o.draft_quant,
        "synthetic_layers": {"target": o.layers, "draft": o.draft_layers or o.layers} if o.synthetic else None,
        "synthetic_tokenizer": tokenizer_source,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
        "dtype": str(dtype).removeprefix("torch."),
        "static": o.static,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "max_new_tokens": o.max_new_tokens,
        "ignore_eos": runner.params.ignore_eos,
        "sampling": {"temperature": o.temperature, "top_p": o.top_p, "top_k": o.top_k},
        "repeats": o.repeats,
        "accept_policy": o.accept_policy,
        "prompts": [{"name": p.name, "workload": p.workload} for p in prompts],
        "memory_kind": runner.meter.kind,
        "process_peak_rss_bytes": peak_rss,
        "tokens_per_s": "output tokens over all prompts / summed wall time of generate() (prefill included), "
                        "median over repeats",
        **o.extra_meta,
    }
    runs = [{k: v for k, v in asdict(r).items() if k != "token_ids"} for r in records]
    return {"meta": meta, "configs": rows, "rooflines": rooflines, "runs": runs}
