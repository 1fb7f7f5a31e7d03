"""Plain decode tokens/s against the bandwidth roofline, and next to transformers' generate, same run.

    python benchmarks/decode.py --synthetic qwen2.5-0.5b --dtype bfloat16 --max-new-tokens 64
    python benchmarks/decode.py --model tiny-code --dtype float32 --wide
    python benchmarks/decode.py --synthetic qwen2.5-0.5b --stored bfloat16 --dtype float32 --wide
    python benchmarks/decode.py --synthetic qwen2.5-7b --device cuda --static --quant none,int4,fp8-block

Each target (--quant: the model as loaded, and each load-time scheme) and transformers decode
greedily the same random prompt for the same number of tokens (EOS ignored), the runs interleaved;
the median over --repeats is reported. Per target: tokens/s, the weight bytes it reads per step
(speclite.engine.memory.step_bytes) and the fraction of the roofline reached (weight bytes / copy
bandwidth, measured in the same run, is the fastest a batch-1 step can be). transformers runs its
dynamic cache and, with --hf-static, its static cache with torch.compile where that works (a
failure is one line of output, not the end of the run). speclite's models are prepared as LLM
prepares them (speclite.model.prepare): float32 weights exact in 16 bits narrowed, then the arena
(CPU), q/k/v and gate/up joined (GPU); --wide also times the model as loaded, every weight float32
(what narrowing saves); --stored picks the synthetic checkpoint's dtype (most real ones are bf16)
apart from the run's --dtype.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from speclite import hub
from speclite.bench.roofline import copy_bandwidth
from speclite.bench.runner import sync
from speclite.engine.loop import Request, decode
from speclite.engine.memory import step_bytes
from speclite.model import load_model
from speclite.model.loader import resolve_device, resolve_dtype
from speclite.model.prepare import prepare
from speclite.quant import quantize_model
from speclite.sampling import SamplingParams
from speclite.synthetic import build_synthetic


def time_speclite(model, prompt, n, device, static) -> float:
    cache = model.new_cache(len(prompt) + n + 8)
    request = Request(prompt, SamplingParams(max_new_tokens=n, ignore_eos=True))
    if static:
        from speclite.model.static import StaticDecoder

        model = StaticDecoder(model, cache)
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        produced = sum(len(c) for c in decode(model, cache, request))
    sync(device)
    assert produced == n
    return n / (time.perf_counter() - start)


def time_transformers(model, prompt, n, device, static: bool) -> float:
    ids = torch.tensor([prompt], device=device)
    extra = {"cache_implementation": "static"} if static else {}
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, pad_token_id=0, **extra)
    sync(device)
    assert out.shape[1] - len(prompt) == n
    return n / (time.perf_counter() - start)


def load_transformers(model_dir, dtype, device, static: bool):
    """transformers' model; with `static`, its forward compiled (CUDA only: torch.compile's CPU
    path needs a C++ toolchain per graph and is no yardstick there)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
    if static and device.type == "cuda":
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="alias, repo id or directory")
    src.add_argument("--synthetic", help="shipped config name (qwen2.5-0.5b, qwen2.5-7b, ...) or config.json")
    ap.add_argument("--layers", type=int, default=None, help="synthetic: fewer layers, for a quicker run")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--stored", default=None, help="synthetic: the checkpoint's dtype (default: --dtype)")
    ap.add_argument("--wide", action="store_true", help="also time the model as loaded, without narrowing")
    ap.add_argument("--quant", default="none", help="comma list of targets: none (as loaded) and load-time schemes "
                    "(int4, w8a8, fp8-block, int4/w8a8, ...)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--static", action="store_true", help="static-shape decode step (CUDA graph on CUDA)")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--hf-static", action="store_true",
                    help="also transformers with its static cache (and torch.compile on CUDA)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    schemes = [s.strip() for s in args.quant.split(",") if s.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        stored = resolve_dtype(args.stored, device) if args.stored else dtype
        model_dir = build_synthetic(args.synthetic, tmp, layers=args.layers, dtype=stored,
                                    device=device) if args.synthetic \
            else hub.resolve(args.model)
        ours = {}  # label -> speclite's model
        for scheme, wide in [(s, False) for s in schemes] + ([("none", True)] if args.wide else []):
            model = load_model(model_dir, device=device, dtype=dtype)
            if scheme != "none":
                quantize_model(model, scheme)
            prepare(model, narrowed=not wide)  # as LLM prepares a user's weights
            ours[f"speclite {scheme}" + (", not narrowed" if wide else "") + (" (static)" if args.static else "")] = model
        theirs = {}
        if not args.skip_transformers:
            theirs["transformers generate"] = (load_transformers(model_dir, dtype, device, False), False)
            if args.hf_static:
                theirs["transformers generate, static cache" + (" + torch.compile" if device.type == "cuda" else "")] = (
                    load_transformers(model_dir, dtype, device, True), True)
        vocab = next(iter(ours.values())).args.vocab_size
        prompt = torch.randint(0, vocab, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
        n = args.max_new_tokens
        # Warm-up every runner (allocations, CUDA graph capture, compilation), then interleave the timed runs.
        runners = {label: (lambda m=m: time_speclite(m, prompt, n, device, args.static)) for label, m in ours.items()}
        for label, (model, static) in theirs.items():
            runners[label] = lambda m=model, st=static: time_transformers(m, prompt, n, device, st)
        for label, run in list(runners.items()):
            try:
                run()
            except Exception as e:  # transformers' compile "where that works": say why, keep the rest
                print(f"{label}: not run ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
                del runners[label]
        speeds = {label: [] for label in runners}
        for _ in range(args.repeats):
            for label, run in runners.items():
                speeds[label].append(run())
        bandwidth = copy_bandwidth(device)
    name = args.synthetic or args.model
    print(f"model {name} ({str(dtype).removeprefix('torch.')}), {device.type}"
          f"{' ' + torch.cuda.get_device_name(device) if device.type == 'cuda' else ''}, "
          f"{torch.get_num_threads()} threads, prompt {args.prompt_len}, {n} new tokens, median of {args.repeats}; "
          f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    best_hf = max((statistics.median(v) for label, v in speeds.items() if label in theirs), default=None)
    for label, values in speeds.items():
        tps = statistics.median(values)
        line = f"{label:52s} {tps:9.2f} tok/s"
        if label in ours:
            weights = step_bytes(ours[label])
            line += (f"  {weights / 1e9:6.2f} GB of weights, {weights * tps / 1e9:7.1f} GB/s = "
                     f"{weights * tps / bandwidth:.2f} of the roofline")
            if best_hf:
                line += f", {tps / best_hf:.2f}x transformers' best"
        print(line)


if __name__ == "__main__":
    main()
