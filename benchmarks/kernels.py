"""Kernel benchmarks on one CUDA GPU: speclite's Triton kernels vs torch's own ops (the GEMMs:
dense bf16 for decode / verification rows, W4A16, FP8-block, W8A8; the decode / verification
attention against torch's SDPA as the decoder called it before).

Shapes are the linear layers of Qwen2.5-7B- and 0.5B-sized decoders (--shapes) at batch M = 1 (a
decode step), 2..9 (a verification of k + 1 rows, k = 1..8) and one prefill M. A GEMM's time
is the median GPU time of its kernels (CUDA events, with the host's launches hidden as a CUDA
graph hides them) with L2 flushed before each rep (small layers would otherwise be served from
L2); the verification kernels, which run eagerly after the step, are timed by wall clock.
Reported: achieved GB/s against the measured device copy bandwidth, TFLOP/s against the measured
bf16 matmul rate, and the time ratio to torch's bf16 matmul (for FP8 also to torch._scaled_mm,
for int8 to torch._int_mm) on the same shape. A relative error against the torch path is printed
with each row as a sanity check.

    python benchmarks/kernels.py [--prefill-m 2048] [--reps 50]
"""

import argparse
import statistics
import sys
import time

import torch

SHAPES = {"7b": (3584, 18944, 4 * 128), "0.5b": (896, 4864, 2 * 64)}  # hidden, intermediate, KV width
HEADS = {"7b": (28, 4, 128), "0.5b": (14, 2, 64)}  # query heads, KV heads, head dim


def layers(shape: str) -> dict[str, tuple[int, int]]:
    """name: (N, K) of y[M, N] = x[M, K] @ W^T for each linear layer of a block of `shape`."""
    hidden, inter, kv = SHAPES[shape]
    return {"qkv_proj": (hidden + 2 * kv, hidden), "o_proj": (hidden, hidden),
            "gate_up_proj": (2 * inter, hidden), "down_proj": (hidden, inter)}


DECODE_M = tuple(range(1, 10))
VOCAB = 152064  # Qwen2.5 vocabulary, for the verification kernels

_flush = None


def median_ms(fn, reps: int) -> float:
    """GPU time of fn's kernels, L2 flushed before each call: what they cost inside a CUDA graph."""
    from speclite.kernels.tuning import gpu_median_ms

    return gpu_median_ms(fn, reps, before=_flush.zero_)


def wall_ms(fn, reps: int) -> float:
    """Host and GPU time of an eager call: verification runs after the step's graph, launch by launch."""
    fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def copy_bandwidth_gbs(reps: int) -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps)
    return 2 * src.numel() / ms / 1e6  # read + write


def bf16_matmul_tflops(reps: int) -> float:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = median_ms(lambda: a @ b, reps)
    return 2 * 8192**3 / ms / 1e9


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-12)).item()


def make_w4a16(n: int, k: int, group: int = 128):
    groups = k // group
    qweight = torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32, device="cuda")
    qzeros = torch.randint(-2**31, 2**31 - 1, (groups, n // 8), dtype=torch.int32, device="cuda")
    scales = (torch.rand(groups, n, device="cuda") * 2e-3 + 1e-3).half()
    nbytes = qweight.numel() * 4 + qzeros.numel() * 4 + scales.numel() * 2
    return (qweight, qzeros, scales, None, group), nbytes


def make_fp8(n: int, k: int):
    w = torch.randn(n, k, device="cuda").clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(-(-n // 128), -(-k // 128), device="cuda") * 1e-3 + 1e-4
    return (w, s), w.numel() + s.numel() * 4


def make_int8(n: int, k: int):
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
    s = torch.rand(n, 1, device="cuda") * 1e-2 + 1e-3
    return (w, s), w.numel() + s.numel() * 4


def torch_path(fn, *args):
    from speclite.kernels import force_torch

    force_torch(True)
    try:
        return fn(*args)
    finally:
        force_torch(False)


def bench_gemms(shape, m_values, reps, bw_gbs, peak_tflops):
    import speclite.kernels as K
    from speclite.kernels.dispatch import fp8_dot_supported

    print(f"\n{shape} shapes")
    print(f"{'kernel':10} {'layer':13} {'M':>5} {'ms':>8} {'GB/s':>7} {'%bw':>5} {'TFLOP/s':>8} {'%mm':>5} "
          f"{'bf16 ms':>8} {'x bf16':>7} {'vendor ms':>9} {'x vendor':>8} {'rel err':>8}")
    for name, (n, k) in layers(shape).items():
        w_bf16 = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        made = {"dense-bf16": ((w_bf16,), w_bf16.numel() * 2), "w4a16": make_w4a16(n, k), "w8a8-int8": make_int8(n, k)}
        if fp8_dot_supported(w_bf16):  # fp8 tensor cores: Ada/Hopper and newer
            made["fp8-block"] = make_fp8(n, k)
        for m in m_values:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            bf16_ms = median_ms(lambda: x @ w_bf16.T, reps)
            for kind, (args, w_bytes) in made.items():
                if kind == "dense-bf16":  # decode / verification rows: the Triton GEMM (prefill: torch's)
                    fn = K.linear
                    vendor = None  # the bf16 column is torch's matmul on this weight
                elif kind == "w4a16":
                    fn = K.w4a16_gemm
                    vendor = None
                elif kind == "fp8-block":
                    fn = K.fp8_block_gemm
                    vendor = scaled_mm_call(x, args[0])
                else:
                    fn = K.int8_gemm
                    vendor = int_mm_call(x, args[0])
                try:
                    y = fn(x, *args)  # first call tunes the launch config for this shape
                    err = rel_err(y, torch_path(fn, x, *args))
                    ms = median_ms(lambda: fn(x, *args), reps)
                except Exception as e:  # one kernel's failure on this GPU: say it, time the rest
                    print(f"{kind:10} {name:13} {m:5d} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    continue
                nbytes = w_bytes + x.numel() * 2 + m * n * 2
                gbs = nbytes / ms / 1e6
                tflops = 2 * m * n * k / ms / 1e9
                try:
                    vendor_ms = median_ms(vendor, reps) if vendor else float("nan")
                except RuntimeError as e:  # torch's op refuses this shape on this GPU
                    print(f"{kind:10} {name:13} {m:5d} torch's op: {str(e).splitlines()[0][:160]}")
                    vendor_ms = float("nan")
                print(f"{kind:10} {name:13} {m:5d} {ms:8.4f} {gbs:7.0f} {100 * gbs / bw_gbs:4.0f}% {tflops:8.2f} "
                      f"{100 * tflops / peak_tflops:4.0f}% {bf16_ms:8.4f} {bf16_ms / ms:7.2f} {vendor_ms:9.4f} "
                      f"{vendor_ms / ms:8.2f} {err:8.1e}")


def scaled_mm_call(x: torch.Tensor, w_fp8: torch.Tensor):
    """torch._scaled_mm with per-tensor scales on pre-quantized x (padded to M % 16 == 0): no
    block scales and no activation quantization, so it is a lower bound for the fp8 GEMM itself."""
    m = x.shape[0]
    xq = torch.nn.functional.pad(x, (0, 0, 0, -m % 16)).to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    return lambda: torch._scaled_mm(xq, w_fp8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def int_mm_call(x: torch.Tensor, w_int8: torch.Tensor):
    """torch._int_mm on pre-quantized x, padded to the M > 16 its CUDA kernel requires."""
    m = x.shape[0]
    xq = torch.nn.functional.pad(x, (0, 0, 0, max(0, 17 - m))).clamp(-127, 127).to(torch.int8)
    xq = torch.nn.functional.pad(xq, (0, 0, 0, -xq.shape[0] % 8))
    return lambda: torch._int_mm(xq, w_int8.T)


def bench_verify(reps):
    """Rejection sampling's Triton kernel against its torch path (greedy verification is torch's
    argmax on every device)."""
    import speclite.kernels as K

    print(f"\n{'verify':10} {'k':>3} {'triton ms':>10} {'torch ms':>9} {'x torch':>8}   (V={VOCAB}, one sequence)")
    for k in (1, 4, 8, 16):
        q = torch.softmax(torch.randn(k, VOCAB, device="cuda"), -1)
        p = torch.softmax(torch.randn(k + 1, VOCAB, device="cuda"), -1)
        tokens = torch.multinomial(q, 1).view(-1)
        u, ru = torch.rand(k, device="cuda"), torch.rand(1, device="cuda")
        args = (tokens, q, p, u, ru)
        try:
            got = [int(v) for v in K.verify_rejection(*args)]
        except Exception as e:
            print(f"rejection  {k:3d} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        assert got == [int(v) for v in torch_path(K.verify_rejection, *args)], f"k={k}: Triton and torch disagree"
        ms = wall_ms(lambda: K.verify_rejection(*args), reps)
        torch_ms = wall_ms(lambda: torch_path(K.verify_rejection, *args), reps)
        print(f"rejection  {k:3d} {ms:10.4f} {torch_ms:9.4f} {torch_ms / ms:8.2f}")


def bench_attention(shape, reps, bw_gbs):
    """The decode / verification attention kernel (1 and 9 rows, causal; from q/k/v projections: RoPE and
    the cache write included) at several cache lengths against torch's SDPA alone as the decoder called
    it before (RoPE and the cache write a kernel of their own then): no mask for one row (its flash
    backend), a mask for more (its math backend, which grouped KV heads take under a mask). GB/s: the
    keys and values read."""
    import torch.nn.functional as F

    from speclite.kernels import gpu_layer_ops

    heads, kv, d = HEADS[shape]
    print(f"\n{'attention':10} {shape:5} {'keys':>6} {'rows':>4} {'ms':>8} {'GB/s':>7} {'%bw':>5} {'sdpa ms':>8} "
          f"{'x sdpa':>7} {'rel err':>8}")
    for keys in (512, 4096, 32768):
        cache_k, cache_v = torch.randn(2, kv, keys + 16, d, dtype=torch.bfloat16, device="cuda")
        cos, sin = torch.rand(2, 9, 1, d, dtype=torch.bfloat16, device="cuda")
        for t in (1, 9):
            first = keys - t
            qkv = torch.randn(t, (heads + 2 * kv) * d, dtype=torch.bfloat16, device="cuda")
            mask = None if t == 1 else (torch.arange(keys, device="cuda")[None, :]
                                        <= torch.arange(first, keys, device="cuda")[:, None])

            def ours():
                return gpu_layer_ops.attention(qkv, cos[:t], sin[:t], cache_k, cache_v, first, None, heads)

            try:
                out = ours()
                ms = median_ms(ours, reps)
            except Exception as e:
                print(f"attention  {shape:5} {keys:6d} {t:4d} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            q = gpu_layer_ops.rope_cache(qkv, cos[:t], sin[:t], cache_k, cache_v, first, heads, kv)  # the same q

            def sdpa():
                return F.scaled_dot_product_attention(q.transpose(0, 1)[None], cache_k[None, :, :keys],
                                                      cache_v[None, :, :keys], attn_mask=mask, enable_gqa=True)

            err = rel_err(out, sdpa()[0].transpose(0, 1).reshape(t, -1))
            sdpa_ms = median_ms(sdpa, reps)
            gbs = 2 * kv * keys * d * 2 / ms / 1e6
            print(f"attention  {shape:5} {keys:6d} {t:4d} {ms:8.4f} {gbs:7.0f} {100 * gbs / bw_gbs:4.0f}% {sdpa_ms:8.4f} "
                  f"{sdpa_ms / ms:7.2f} {err:8.1e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill-m", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--shapes", default="7b,0.5b", help=f"comma list of {', '.join(SHAPES)}")
    args = parser.parse_args()
    shapes = [shape.strip() for shape in args.shapes.split(",")]
    if unknown := [shape for shape in shapes if shape not in SHAPES]:
        parser.error(f"unknown shape {unknown[0]!r}: choose from {', '.join(SHAPES)}")
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 1
    from speclite.kernels.dispatch import triton_available

    if not triton_available():
        print("benchmarks/kernels.py needs triton installed (pip install 'speclite[gpu]')", file=sys.stderr)
        return 1
    global _flush
    _flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")  # larger than any L2
    bw = copy_bandwidth_gbs(args.reps)
    peak = bf16_matmul_tflops(args.reps)
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw:.0f} GB/s, bf16 matmul {peak:.0f} TFLOP/s")
    for shape in shapes:
        bench_attention(shape, args.reps, bw)
        bench_gemms(shape, DECODE_M + (args.prefill_m,), args.reps, bw, peak)
    bench_verify(args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
