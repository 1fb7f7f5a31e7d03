"""speclite's bf16 CPU GEMV next to torch.mv on one decode step's matmuls, same run.

Every linear of a model shape (Qwen2.5-0.5B by default, lm_head included) gets random bf16
weights; one pass multiplies each by one activation row, so the weights stream from memory as in
a real decode step. Passes alternate between the two; the median of --repeats is reported with
the weight bytes streamed per second.

    python benchmarks/cpu_gemv.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from speclite.kernels import cpu_gemm, cpu_gemv
from speclite.synthetic import synthetic_config


def shapes(config: dict) -> list[tuple[int, int]]:
    h, i = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    layer = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]
    return layer * config["num_hidden_layers"] + [(config["vocab_size"], h)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen2.5-0.5b")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = synthetic_config(args.config)
    if args.layers:
        config["num_hidden_layers"] = args.layers
    weights = [torch.randn(n, k, dtype=torch.bfloat16) * 0.02 for n, k in shapes(config)]
    xs = {w.shape[1]: torch.randn(1, w.shape[1], dtype=torch.bfloat16) for w in weights}
    contestants = {"torch.mv": lambda: [torch.mv(w, xs[w.shape[1]][0]) for w in weights]}
    if cpu_gemv.available():
        contestants["speclite avx512 bf16"] = lambda: [cpu_gemv.gemm_bf16(xs[w.shape[1]], w) for w in weights]
    if cpu_gemm.available():
        mats = [cpu_gemm.dense_matrices([w], avx512_first=False) for w in weights]
        contestants["speclite avx2 bf16"] = lambda: [cpu_gemm.matmul(xs[w.shape[1]], m) for w, m in zip(weights, mats)]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    times = {name: [] for name in contestants}
    for run in contestants.values():
        run()  # warm-up (and the kernel's one-time build)
    for _ in range(args.repeats):
        for name, run in contestants.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    print(f"{args.config}: {config['num_hidden_layers']} layers + lm_head, {nbytes / 1e9:.2f} GB of bf16 weights, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}")
    base = statistics.median(times["torch.mv"])
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"  {name:<20} {t * 1e3:7.2f} ms  {nbytes / t / 1e9:5.1f} GB/s  {base / t:5.2f}x")


if __name__ == "__main__":
    main()
