"""Decode speed and weight memory per quantization scheme, side by side (CPU or GPU).

A random-weight model of a real shape (Qwen2.5-0.5B's config by default, fewer layers with
--layers) is saved, quantized with RTN to each scheme, loaded with speclite.model.load_model and
decoded greedily one token at a time (nf4, a load-time scheme, is quantized after loading the
dense model: `--schemes dense,nf4`). BODY/HEAD also quantizes lm_head at load time, e.g.
`--schemes int4,int4/w8a8`. --ops also times the single matmuls the CPU paths are chosen from.

    python benchmarks/quant.py --layers 4 --tokens 32 --ops
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import torch

from speclite.model import load_model
from speclite.quant import SCHEMES, quantize_lm_head, quantize_model, quantize_to_dir
from speclite.quant.linear import QuantLinear

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                  max_position_embeddings=32768, rope_theta=1000000.0)


def build_model(path: Path, layers: int) -> Path:
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(**{**QWEN25_05B, "num_hidden_layers": layers})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    return path


def linear_bytes(model) -> int:
    """Resident bytes of the decoder linears (what quantization shrinks); embeddings excluded."""
    total = 0
    for block in model.model.layers:
        for m in block.modules():
            if isinstance(m, (QuantLinear, torch.nn.Linear)):
                total += sum(t.numel() * t.element_size() for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)) if t is not None)
    return total


def decode_tokens_per_s(model, prompt_len: int, tokens: int) -> float:
    cache = model.new_cache(prompt_len + tokens + 2)  # + the untimed warm-up steps
    prompt = torch.randint(0, model.args.vocab_size, (prompt_len,))
    with torch.no_grad():
        nxt = model(prompt, cache, num_logits=1).argmax(-1)
        for _ in range(2):  # warm-up steps, not timed
            nxt = model(nxt, cache, num_logits=1).argmax(-1)
        start = time.perf_counter()
        for _ in range(tokens):
            nxt = model(nxt, cache, num_logits=1).argmax(-1)
    return tokens / (time.perf_counter() - start)


def median_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def op_table(k: int, n: int) -> list[tuple[str, float]]:
    """[1, K] x [K, N] with each CPU path the quantized linears could take."""
    from speclite.quant.int4 import quantize_rtn
    from speclite.quant.int8 import quantize_int8_channel

    torch.manual_seed(0)
    x, w = torch.randn(1, k), torch.randn(n, k) * 0.02
    xb, wb = x.bfloat16(), w.bfloat16()
    q8, s8 = quantize_int8_channel(w)
    q8_kn = q8.t().contiguous()
    s8b = s8.reshape(-1).bfloat16()

    def w8a8(weight_kn):  # true W8A8: x quantized per token at run time (amax / 127)
        xs = x.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127
        xq = (x / xs).round().clamp(-127, 127).to(torch.int8)
        return torch._int_mm(xq, weight_kn).float() * xs * s8.reshape(1, -1)

    q4 = quantize_rtn(w, 128, sym=False)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4.q.to(torch.int32), 1)
    s = q4.scales.float()
    sz = torch.stack([s, (8 - q4.zeros.float()) * s], -1)
    rows = [
        ("fp32 F.linear", lambda: torch.nn.functional.linear(x, w)),
        ("bf16 F.linear", lambda: torch.nn.functional.linear(xb, wb)),
        ("int8 weight-only _weight_int8pack_mm (bf16 x)", lambda: torch.ops.aten._weight_int8pack_mm(xb, q8, s8b)),
        ("w8a8 _int_mm, weight [N,K] transposed view", lambda: w8a8(q8.t())),
        ("w8a8 _int_mm, weight [K,N] contiguous", lambda: w8a8(q8_kn)),
        ("int4 _weight_int4pack_mm_for_cpu g128 (bf16 x)",
         lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed, 128, sz.bfloat16())),
        ("int4 _weight_int4pack_mm_for_cpu g128 (fp32 x)",
         lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 128, sz)),
    ]
    if importlib.util.find_spec("bitsandbytes"):  # optional: pip install 'speclite[bnb]'
        import bitsandbytes

        p4, s4 = bitsandbytes.functional.quantize_4bit(wb, blocksize=64, compress_statistics=True, quant_type="nf4")
        lt = bitsandbytes.MatmulLtState(CB=q8, SCB=s8.reshape(-1) * 127)
        lt.threshold, lt.has_fp16_weights, lt.is_training = 6.0, False, False
        rows += [
            ("bnb nf4 matmul_4bit (bf16 x)", lambda: bitsandbytes.matmul_4bit(xb, p4.t(), quant_state=s4)),
            ("bnb nf4 dequantize_4bit (whole weight)", lambda: bitsandbytes.functional.dequantize_4bit(p4, s4)),
            ("bnb LLM.int8 matmul, threshold 6 (fp16 x)", lambda: bitsandbytes.matmul(x.half(), q8, state=lt)),
        ]
    return [(name, median_ms(fn, reps=10)) for name, fn in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (24 = the real Qwen2.5-0.5B)")
    ap.add_argument("--tokens", type=int, default=32, help="decode steps timed per scheme")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--schemes", default="dense,fp8-block,int4,w8a8")
    ap.add_argument("--dtype", default="auto", help="model dtype for load_model (auto: fp32 on CPU, bf16 on CUDA)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--ops", action="store_true", help="also time single [1,K]x[K,N] matmuls per CPU path")
    ap.add_argument("--ops-shape", default="4096,11008", help="K,N for --ops")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        dense = build_model(Path(tmp) / "dense", args.layers)
        print(f"Qwen2.5-0.5B shape, {args.layers} layers, {args.tokens} decode tokens, "
              f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        # lm_head (vocab x hidden) is timed on its own: at 0.5B it is a large part of a step.
        print(f"{'scheme':<10} {'path':<14} {'disk MB':>8} {'linear MB':>10} {'tok/s':>8} {'ms/tok':>8} {'lm_head ms':>11} {'rest ms':>8}")
        for scheme in args.schemes.split(","):
            body, _, head = scheme.partition("/")  # "int4/w8a8": int4 checkpoint, lm_head int8 at load time
            path = dense
            if body in SCHEMES:
                path = Path(tmp) / body
                if not path.exists():
                    quantize_to_dir(dense, path, body)
            model = load_model(path, args.device, args.dtype)
            if body not in ("dense", *SCHEMES):  # nf4: quantized at load time, disk MB is the dense model's
                model = quantize_model(model, body)
            if head:
                model = quantize_lm_head(model, head)
            kinds = {m.path for m in model.modules() if isinstance(m, QuantLinear)} or {"F.linear"}
            disk = sum(f.stat().st_size for f in path.glob("*.safetensors")) / 1e6
            tps = decode_tokens_per_s(model, args.prompt_len, args.tokens)
            embed = model.model.embed_tokens.weight
            h = torch.randn(1, model.args.hidden_size, dtype=embed.dtype, device=embed.device)
            with torch.no_grad():
                head = median_ms(lambda: model.lm_head(h), reps=10)
            step = 1e3 / tps
            print(f"{scheme:<10} {','.join(sorted(kinds)):<14} {disk:>8.1f} {linear_bytes(model) / 1e6:>10.1f} "
                  f"{tps:>8.1f} {step:>8.1f} {head:>11.1f} {step - head:>8.1f}")
            del model
    if args.ops:
        k, n = (int(v) for v in args.ops_shape.split(","))
        print(f"\n[1,{k}] x [{k},{n}] median ms")
        for name, ms in op_table(k, n):
            print(f"  {name:<50} {ms:8.2f}")


if __name__ == "__main__":
    main()
