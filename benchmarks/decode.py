"""Plain decode tokens/s: speclite next to transformers' generate, same model, same run.

    python benchmarks/decode.py --synthetic qwen2.5-0.5b --dtype bfloat16 --max-new-tokens 64
    python benchmarks/decode.py --model tiny-code --dtype float32
    python benchmarks/decode.py --synthetic qwen2.5-7b --device cuda --static   # GPU, CUDA graphs

Both decode greedily the same random prompt for the same number of tokens (EOS ignored); the
median over --repeats interleaved runs is reported, and the ratio speclite / transformers.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from speclite import hub
from speclite.bench.runner import sync
from speclite.engine.loop import Request, decode
from speclite.sampling import SamplingParams
from speclite.model import load_model
from speclite.model.loader import resolve_device, resolve_dtype
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


def time_transformers(model, prompt, n, device) -> float:
    ids = torch.tensor([prompt], device=device)
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, pad_token_id=0)
    sync(device)
    assert out.shape[1] - len(prompt) == n
    return n / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="alias, repo id or directory")
    src.add_argument("--synthetic", help="shipped config name (qwen2.5-0.5b, qwen2.5-7b, ...) or config.json")
    ap.add_argument("--layers", type=int, default=None, help="synthetic: fewer layers, for a quicker run")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--static", action="store_true", help="static-shape decode step (CUDA graph on CUDA)")
    ap.add_argument("--skip-transformers", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_synthetic(args.synthetic, tmp, layers=args.layers, dtype=dtype) if args.synthetic \
            else hub.resolve(args.model)
        ours = load_model(model_dir, device=device, dtype=dtype)
        theirs = None
        if not args.skip_transformers:
            from transformers import AutoModelForCausalLM

            theirs = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
        vocab = ours.args.vocab_size
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, vocab, (args.prompt_len,), generator=gen).tolist()
        n = args.max_new_tokens
        weight_bytes = sum(p.numel() * p.element_size() for p in ours.parameters())
        # Warm-up both (allocations, CUDA graph capture, lazy init), then interleave the timed runs.
        time_speclite(ours, prompt, min(n, 8), device, args.static)
        if theirs is not None:
            time_transformers(theirs, prompt, min(n, 8), device)
        ours_tps, theirs_tps = [], []
        for _ in range(args.repeats):
            ours_tps.append(time_speclite(ours, prompt, n, device, args.static))
            if theirs is not None:
                theirs_tps.append(time_transformers(theirs, prompt, n, device))
    name = args.synthetic or args.model
    print(f"model {name} ({weight_bytes / 1e9:.2f} GB of weights, {str(dtype).removeprefix('torch.')}), "
          f"{device.type}, {torch.get_num_threads()} threads, prompt {args.prompt_len}, {n} new tokens, "
          f"median of {args.repeats}")
    ours_med = statistics.median(ours_tps)
    print(f"speclite{' (static)' if args.static else ''}: {ours_med:8.2f} tok/s   "
          f"({weight_bytes / 1e9 * ours_med:.1f} GB/s of weights)")
    if theirs_tps:
        theirs_med = statistics.median(theirs_tps)
        print(f"transformers generate: {theirs_med:8.2f} tok/s")
        print(f"ratio speclite / transformers: {ours_med / theirs_med:.2f}x")


if __name__ == "__main__":
    main()
