"""speclite's CPU kernels on each ISA path of this CPU next to torch's own CPU ops, per weight
format, one row and many rows; and its attention over a KV cache.

    python benchmarks/cpu_kernels.py --threads 2 --rows 1,128
    python benchmarks/cpu_kernels.py --threads 2 --attention --rows 1,5 --context 512,2048

For each Qwen2.5-0.5B matmul shape (gate/up, down, a quarter of the head; `--shapes pair`: the
embedded pair's drafters' head, gate/up and EAGLE-3 head) and each row count: int4 (group 128)
against aten._weight_int4pack_mm_for_cpu, int8 against aten._weight_int8pack_mm, bf16 against
F.linear, and bf16 as a drafter's (loose: AMX bf16 tiles on the amx path, vdpbf16ps on Zen 4's
avx512 path), all with bf16 activations; speclite once per ISA path the CPU runs (AVX-512 and AVX2 on
an AVX-512 machine).
Calls alternate; medians of --repeats. The int8 rows compare W8A8 (ours quantizes activations) with
torch's weight-only op: the nearest op torch has.

--attention: speclite's attention (RoPE, the cache write, softmax attention over the cache) for rows
new tokens after `context` cached ones, against torch's scaled_dot_product_attention on the same
cache (without the RoPE and the write), fp32, for the heads of Qwen2.5-0.5B, the embedded pair's
target and Qwen3-8B.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from speclite.kernels import cpu_build, cpu_gemm, cpu_layer_ops

SHAPES = {"qwen2.5-0.5b": [(4864, 896), (896, 4864), (151936 // 4, 896)],
          "pair": [(4096, 128), (768, 128), (2048, 256)]}
HEADS = {"Qwen2.5-0.5B": (14, 2, 64), "tiny-code": (4, 2, 64), "Qwen3-8B": (32, 8, 128)}  # q heads, kv heads, d


def contestants(n: int, k: int, m: int) -> dict[str, dict[str, callable]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    groups = k // 128
    scales, zeros = (torch.rand(groups, n, generator=g) * 0.01).half(), torch.full((groups, n), 8, dtype=torch.uint8)
    mats = cpu_gemm.int4_matrices([cpu_gemm.pack_int4(q, scales, zeros, 128)], [n], k, 128)
    int4pack = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.int(), 1)
    sz = torch.stack([scales.float(), torch.zeros(groups, n)], -1).to(torch.bfloat16)
    w8 = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    w8p, ws = cpu_gemm.pack_int8(w8), torch.rand(n, generator=g) * 0.01
    wb = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    m8 = cpu_gemm.int8_matrices([w8p], [ws], k)
    mb = cpu_gemm.dense_matrices([wb])
    ours = {"int4": mats, "int8": m8, "bf16": mb, "bf16 drafter": cpu_gemm.dense_matrices([wb], loose=True)}
    theirs = {"int4": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, int4pack, 128, sz),
              "int8": lambda: torch.ops.aten._weight_int8pack_mm(x, w8, ws.bfloat16()),
              "bf16": lambda: torch.nn.functional.linear(x, wb)}
    theirs["bf16 drafter"] = theirs["bf16"]
    return {fmt: {**{path: on_path(path, lambda mt=mt: cpu_gemm.matmul(x, mt)) for path in cpu_build.runnable()},
                  "torch": theirs[fmt]} for fmt, mt in ours.items()}


def attention_contestants(shape: tuple[int, int, int], context: int, m: int) -> dict[str, callable]:
    heads, kv_heads, d = shape
    g = torch.Generator().manual_seed(0)
    max_len = context + m
    qkv = torch.randn(m, (heads + 2 * kv_heads) * d, generator=g)
    angles = torch.rand(m, d // 2, generator=g)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    cache_k, cache_v = torch.randn(kv_heads, max_len, d, generator=g), torch.randn(kv_heads, max_len, d, generator=g)
    q = qkv[:, : heads * d].view(m, heads, d).transpose(0, 1)[None]
    mask = torch.arange(max_len)[None, :] <= torch.arange(context, max_len)[:, None]
    ours = {path: on_path(path, lambda: cpu_layer_ops.attention(qkv, cos, sin, cache_k, cache_v, heads, kv_heads, context,
                                                                 max_len, None)) for path in cpu_build.runnable()}
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, cache_k[None], cache_v[None], attn_mask=mask,
                                                                     enable_gqa=True)
    return {**ours, "torch": sdpa}


def on_path(path: str, call):
    """call() with the kernels of ISA path `path`."""
    def run():
        os.environ["SPECLITE_CPU_ISA"] = path
        cpu_build.isa.cache_clear()
        return call()
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,128")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--attention", action="store_true", help="time the attention instead of the matmuls")
    ap.add_argument("--context", default="512,2048", help="--attention: cached tokens before the rows")
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="qwen2.5-0.5b", help="the matmuls' weight shapes")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu_gemm.available():
        raise SystemExit("speclite's CPU kernels are not available here (no AVX2 CPU or no C++ compiler)")
    paths = cpu_build.runnable()
    print(f"{args.threads} threads, median of {args.repeats}, ms per call; ISA paths {', '.join(paths)}")
    print(f"| {'heads, kv heads, d | context' if args.attention else 'shape N x K'} | rows | "
          f"{'' if args.attention else 'format | '}{' | '.join(f'speclite {p} ms' for p in paths)} | torch ms | "
          f"{' | '.join(f'{p} vs torch' for p in paths)} |")
    print("|---|---|" + ("" if args.attention else "---|") + "---|" * (2 * len(paths) + 1))
    rows = list(map(int, args.rows.split(",")))
    if args.attention:
        cases = [(f"{name} {shape} | {c}", m, {"": attention_contestants(shape, c, m)})
                 for name, shape in HEADS.items() for c in map(int, args.context.split(",")) for m in rows]
    else:
        cases = [(f"{n} x {k}", m, {f"{fmt} | ": pair for fmt, pair in contestants(n, k, m).items()})
                 for n, k in SHAPES[args.shapes] for m in rows]
    for label, m, by_format in cases:
        for fmt, pair in by_format.items():
            ms = timed(pair, args.repeats)
            torch_ms = ms.pop("torch")
            print(f"| {label} | {m} | {fmt}{' | '.join(f'{v:.3f}' for v in ms.values())} | {torch_ms:.3f} | "
                  f"{' | '.join(f'{torch_ms / v:.2f}x' for v in ms.values())} |", flush=True)


def timed(pair: dict[str, callable], repeats: int) -> dict[str, float]:
    """Median ms per call of each contestant, the calls alternating."""
    times = {name: [] for name in pair}
    for f in pair.values():
        f()
    for _ in range(repeats):
        for name, f in pair.items():
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


if __name__ == "__main__":
    main()
