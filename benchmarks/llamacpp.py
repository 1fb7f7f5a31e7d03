"""speclite next to llama.cpp on the CPU: the same weights, equal bits, interleaved rounds, one run.

    python benchmarks/llamacpp.py --threads 2            # full table (~25 min cold, ~12 min cached)
    python benchmarks/llamacpp.py --threads 2 --layers 4 # a quick check of the plumbing
    python benchmarks/llamacpp.py --threads 2 --shape qwen3-0.6b --skip-pair  # Qwen3 (q/k norms)
    python benchmarks/llamacpp.py --threads 2 --isa avx2 --skip-pair  # both sides on AVX2 code only

--isa avx2 on an AVX-512 machine compares the two AVX2 paths: llama.cpp built a second time with
GGML_NATIVE=OFF, AVX2 + FMA + F16C and no AVX-512 (its own build folder), and speclite with
SPECLITE_CPU_ISA=avx2. The same cores run them, so it stands in for an AVX2 machine's table, not
for its absolute speeds.

llama.cpp is built from the llama-cpp-python sdist (pip download --no-binary, cmake with
GGML_NATIVE=ON; llama-bench, llama-speculative, llama-quantize) and cached under
~/.cache/speclite/llamacpp. The model is random weights of Qwen2.5-0.5B's shapes (--shape: another
shipped synthetic config, e.g. qwen3-0.6b; no download),
written once as safetensors with the embedded pair's tokenizer; the converter inside the sdist
(convert_hf_to_gguf.py and its gguf-py) turns it into GGUF f16 and Q8_0, llama-quantize makes Q4_0.
speclite loads the same directory with `--quant` at load time.

Rows: bf16 vs f16, w8a8 (head too) vs Q8_0, int4 (group 64: 4.375 bits per weight against Q4_0's 4.5; int8 head, as Q4_0's Q8_0 output)
vs Q4_0, int4/int4 (head too) vs Q4_0
(llama-quantize --pure, head too). Decode = tg64 after a 32-token prompt (llama-bench -n 64 -d 32;
--depth N for a longer context, where attention weighs more),
prefill = pp128 (llama-bench -p 128). Then the embedded pair (tiny-code + tiny-code-draft): plain
decoding against llama-bench, and each speculative method (PAIR_METHODS, with its trained draft)
against llama-speculative (--spec-draft-n-max 4) on the pair as GGUF f32, and against llama.cpp's own
draft-model and EAGLE-3 speculation (llama-speculative-simple --spec-type, LLAMA_PAIR_METHODS) on
the same drafts converted (the target as a Llama-architecture GGUF there, see target_for_llamacpp_drafters)
and its n-gram speculation (--pair-only: just these;
--temperature T: both sides sample at T, llama.cpp's other samplers off; speclite's plain row then
samples too, llama-bench's does not sample). Each round runs every contestant once; the median over --rounds is printed, with the CPU
model, its ISA flags and the measured copy bandwidth. Run it on an idle machine: the numbers are
only as good as the quiet around them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from speclite import hub  # before torch: speclite bounds OpenMP's spinning as torch loads it (README, Threads)

import torch  # noqa: E402
from speclite.api import LLM
from speclite.kernels import cpu_build
from speclite.engine.loop import Request, decode
from speclite.sampling import SamplingParams
from speclite.model import arena, load_model
from speclite.quant import quantize_model
from speclite.speculate.eagle3.load import parse_config as parse_eagle3_config
from speclite.synthetic import build_synthetic, synthetic_config

VERSION = "0.3.36"
CACHE = Path(os.environ.get("SPECLITE_CACHE_DIR", Path.home() / ".cache" / "speclite")) / "llamacpp"
TARGETS = ["llama-bench", "llama-speculative", "llama-speculative-simple", "llama-quantize"]
# (speclite --quant, llama.cpp GGUF) at equal bits; None = the model's own bf16.
# int4 groups of 64 with an fp16 scale and a uint8 zero: 4.375 bits per weight, Q4_0's 4.5 the nearest.
INT4_GROUP = 64
# llama-quantize keeps the output matrix (the tied embeddings) at Q8_0 in a Q4_0 file: so does the int4 row.
ROWS = [("bf16", None, "f16"), ("w8a8", "w8a8/w8a8", "q8_0"), ("int4", "int4/w8a8", "q4_0"),
        ("int4/int4", "int4/int4", "q4_0-pure")]
PAIR_PROMPT = "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n"
# speclite's methods on the pair, each with the draft trained for it (speclite/assets), all against
# llama-speculative: the speculation this llama.cpp build runs (a draft model, at most 4 drafts).
PAIR_METHODS = [("vanilla k=4", {"method": "vanilla", "num_speculative_tokens": 4}),
                ("pard k=4", {"method": "pard", "model": "tiny-code-pard", "num_speculative_tokens": 4}),
                ("dflash", {"method": "dflash", "model": "tiny-code-dflash"}),
                ("eagle3 k=4", {"method": "eagle3", "model": "tiny-code-eagle3", "num_speculative_tokens": 4}),
                ("suffix", {"method": "suffix"})]
# llama.cpp's own methods (llama-speculative-simple --spec-type) on the same drafts: label, type, drafter
# (None: n-grams of the text so far), drafts at most, speclite's row of the same kind. Not DFlash: this
# build's DFlash reads the inputs of target layers only, and tiny-code-dflash reads the last layer's
# output (target_layer_ids 1, 3, 5 of 6 layers; llama.cpp asserts).
LLAMA_PAIR_METHODS = [("draft model k=4", "draft-simple", "tiny-code-draft", 4, "vanilla k=4"),
                      ("eagle3 k=4", "draft-eagle3", "tiny-code-eagle3", 4, "eagle3 k=4"),
                      ("n-grams", "ngram-mod", None, 4, "suffix")]


# ---- llama.cpp: build and convert ----------------------------------------------------------

def llamacpp_source() -> Path:
    root = CACHE / VERSION
    source = root / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    if source.exists():
        return source
    root.mkdir(parents=True, exist_ok=True)
    archive = root / f"llama_cpp_python-{VERSION}.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                        f"llama-cpp-python=={VERSION}", "-d", str(root)], check=True)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name]
        tar.extractall(root, members=members, filter="data")
    return source


# llama.cpp's CPU flags per --isa: the machine's own, or AVX2 code only.
ISA_FLAGS = {"native": ["-DGGML_NATIVE=ON"],
             "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                      "-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF", "-DGGML_AVX_VNNI=OFF"]}


def build_llamacpp(source: Path, isa: str = "native") -> Path:
    build = source / ("build" if isa == "native" else f"build-{isa}")
    bins = build / "bin"
    if all((bins / t).exists() for t in TARGETS):
        return bins
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", *ISA_FLAGS[isa],
                    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", *TARGETS],
                   check=True, stdout=subprocess.DEVNULL)
    return bins


# The converter refuses tokenizers whose pre-tokenizer hash it does not know (ours is trained
# here); the benchmark only needs the vocabulary, so it is told the pre-tokenizer is Qwen2's.
CONVERT = """
import sys
sys.path[:0] = [{source!r}, {source!r} + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", {model!r}, "--outtype", {outtype!r}, "--outfile", {out!r}, *{target!r}]
convert_hf_to_gguf.main()
"""


def gguf(source: Path, bins: Path, model: Path, kind: str, target: Path | None = None) -> Path:
    """`target`: the model a drafter (EAGLE-3, DFlash) serves, whose tokenizer and config the converter reads."""
    out = CACHE / "gguf" / f"{model.name}-{kind}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        return out
    if kind.startswith("q4_0"):
        cmd = [str(bins / "llama-quantize"), *(["--pure"] if kind.endswith("pure") else []),
               str(gguf(source, bins, model, "f16")), str(out), "q4_0"]
        subprocess.run(cmd, check=True, capture_output=True)
        return out
    code = CONVERT.format(source=str(source), model=str(model), outtype=kind, out=str(out),
                          target=["--target-model-dir", str(target)] if target else [])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"converting {model} to GGUF failed: {done.stderr[-2000:]}")
    return out


def staged(model: Path, name: str, config: dict) -> Path:
    """A directory named `name` holding `config` and links to every other file of `model`."""
    out = CACHE / "staged" / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in model.iterdir():
        if f.name != "config.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    return out


def eagle3_for_llamacpp(head: Path) -> Path:
    """The EAGLE-3 head as llama.cpp's converter reads it: the aux layer ids at the config's top level,
    counted as the inputs of those target layers (llama.cpp's convention and speclite's parsed one);
    the converter reads the top-level key only, and would otherwise take its default layers."""
    cfg = json.loads((head / "config.json").read_text())
    aux = parse_eagle3_config(cfg, str(head)).aux_layers
    return staged(head, head.name, cfg | ({"eagle_aux_hidden_state_layer_ids": list(aux)} if aux is not None else {}))


def target_for_llamacpp_drafters(target: Path) -> Path:
    """The pair's Qwen2 target as a Llama-architecture checkpoint: the same function (Llama's graph takes
    the q/k/v biases; the converter permutes q/k for its rotation), but in this llama.cpp build only
    some architectures' graphs hand their layers' inputs to an EAGLE-3 or DFlash drafter, Llama's among
    them and Qwen2's not."""
    cfg = json.loads((target / "config.json").read_text())
    as_llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    return staged(target, f"{target.name}-as-llama", cfg | as_llama)


# ---- measurements --------------------------------------------------------------------------

# llama-bench's arguments per mode, best first: where a run dies of a signal (llama.cpp's AMX path raised
# SIGILL on an AMX Xeon for Q4_0 and Q8_0 whenever a batch has more than one row, the 32-token context
# included), the model takes the next for that mode from then on, and the table says which it ran.
# Decode first tries its weights repacked with no context (one row a step), then --repack 0.
def bench_tries(mode: str, depth: int) -> list[list[str]]:
    if mode == "decode":
        return [["-p", "0", "-n", "64", "-d", str(depth)], ["-p", "0", "-n", "64", "-d", "0"],
                ["-p", "0", "-n", "64", "-d", str(depth), "--repack", "0"]]
    return [["-p", "128", "-n", "0"], ["-p", "128", "-n", "0", "--repack", "0"]]


FALLBACKS: dict[tuple[str, str], int] = {}  # (model file, mode) -> index into bench_tries


def llama_bench(bins: Path, model: Path, threads: int, mode: str, depth: int = 32) -> float:
    tries = bench_tries(mode, depth)
    key = (model.name, mode)
    while True:
        i = FALLBACKS.get(key, 0)
        done = subprocess.run([str(bins / "llama-bench"), "-m", str(model), "-t", str(threads), "-r", "1", "-o", "json",
                               *tries[i]], capture_output=True, text=True)
        if done.returncode < 0 and i + 1 < len(tries):
            FALLBACKS[key] = i + 1
            print(f"llama-bench died of signal {-done.returncode} on {model.name} ({' '.join(tries[i])}): "
                  f"{' '.join(tries[i + 1])} from now on", flush=True)
            continue
        if done.returncode != 0:
            raise RuntimeError(f"llama-bench failed ({done.returncode}): {done.stderr[-2000:]}")
        return float(json.loads(done.stdout)[0]["avg_ts"])


def llama_sampling(temperature: float) -> list[str]:
    # Greedy (--top-k 1), or pure temperature sampling: llama.cpp's other samplers (top-k 40, top-p 0.95,
    # min-p 0.05 by default) off, as speclite's are.
    return (["--temp", "0", "--top-k", "1"] if temperature == 0 else
            ["--temp", str(temperature), "--top-k", "0", "--top-p", "1.0", "--min-p", "0.0", "--seed", "1"])


def llama_speculative(bins: Path, target: Path, draft: Path, threads: int, k: int, n: int, temperature: float) -> float:
    done = subprocess.run([str(bins / "llama-speculative"), "-m", str(target), "-md", str(draft), "-p", PAIR_PROMPT,
                           "-n", str(n), "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "-t", str(threads), "-td",
                           str(threads), *llama_sampling(temperature), "-c", "512"],
                          capture_output=True, text=True)
    found = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", done.stderr + done.stdout)
    if found is None:
        raise RuntimeError(f"llama-speculative failed: {(done.stderr or done.stdout)[-2000:]}")
    return float(found.group(1))


def llama_speculative_simple(bins: Path, target: Path, draft: Path | None, spec_type: str, threads: int, k: int, n: int,
                             temperature: float) -> tuple[float, float]:
    """(tok/s, drafts accepted / drafted) of llama.cpp's speculation of `spec_type` (its common_speculative:
    a draft model, EAGLE-3, DFlash, ...)."""
    done = subprocess.run([str(bins / "llama-speculative-simple"), "-m", str(target), *(["-md", str(draft)] if draft else []),
                           "--spec-type", spec_type, "-p", PAIR_PROMPT, "-n", str(n), "--spec-draft-n-max", str(k),
                           "--spec-draft-n-min", "0", "-t", str(threads), "-td", str(threads), *llama_sampling(temperature),
                           "-c", "512"],
                          capture_output=True, text=True)
    out = done.stderr + done.stdout
    speed = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", out)
    drafted, accepted = re.search(r"n_drafted\s*=\s*(\d+)", out), re.search(r"n_accept\s*=\s*(\d+)", out)
    if speed is None or drafted is None or accepted is None:
        raise RuntimeError(f"llama-speculative-simple --spec-type {spec_type} failed: {out[-2000:]}")
    return float(speed.group(1)), int(accepted.group(1)) / max(int(drafted.group(1)), 1)


def speclite_decode(model, prompt: list[int], n: int) -> float:
    cache = model.new_cache(len(prompt) + n + 8)
    request = Request(prompt, SamplingParams(max_new_tokens=n, ignore_eos=True))
    with torch.inference_mode():
        model(torch.tensor(prompt[:-1]), cache, num_logits=1)  # the prompt, not timed (as -d 32)
        start = time.perf_counter()
        produced = sum(len(c) for c in decode(model, cache, request))
    assert produced == n
    return n / (time.perf_counter() - start)


def speclite_prefill(model, prompt: list[int]) -> float:
    # One untimed pass first, as llama-bench runs its warm-up prompt before the timed repetition.
    with torch.inference_mode():
        model(torch.tensor(prompt), model.new_cache(len(prompt) + 8), num_logits=1)
        cache = model.new_cache(len(prompt) + 8)
        start = time.perf_counter()
        model(torch.tensor(prompt), cache, num_logits=1)
    return len(prompt) / (time.perf_counter() - start)


def speclite_generate(llm: LLM, n: int, temperature: float) -> tuple[float, float]:
    """(tok/s, drafts accepted / drafted)."""
    # A short run first, as llama-bench and llama-speculative warm up before they time: each LLM here
    # holds its own copy of the pair (23 MB of f32), which the other contestants push out of the L3.
    llm.generate(PAIR_PROMPT, SamplingParams(max_new_tokens=8, ignore_eos=True))
    if llm.engine.spec is not None:  # suffix decoding starts each run without the answers of the runs before
        llm.engine.spec.proposer.forget()
    params = SamplingParams(max_new_tokens=n, ignore_eos=True, temperature=temperature, seed=1)
    start = time.perf_counter()
    out = llm.generate(PAIR_PROMPT, params)[0]
    return len(out.token_ids) / (time.perf_counter() - start), out.stats.accepted / max(out.stats.proposed, 1)


# ---- the machine ---------------------------------------------------------------------------

def machine() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line for line in info.splitlines() if line.startswith("flags")), "").split())
    isa = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "amx_bf16")
           if f in flags]
    return f"{name}; ISA {' '.join(isa)}; copy bandwidth {copy_bandwidth():.1f} GB/s (read+write); {os.cpu_count()} CPUs"


def copy_bandwidth() -> float:
    """GB/s of a 256 MB copy, read + written, the best of five."""
    a = torch.empty(256 << 20, dtype=torch.uint8).fill_(1)
    b = torch.empty_like(a)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        b.copy_(a)
        times.append(time.perf_counter() - start)
    return 2 * a.numel() / min(times) / 1e9


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape", default="qwen2.5-0.5b", help="the synthetic config of the equal-bits rows")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's, for a quick run")
    ap.add_argument("--skip-pair", action="store_true")
    ap.add_argument("--pair-only", action="store_true", help="only the embedded pair's rows")
    ap.add_argument("--depth", type=int, default=32, help="tokens of context before the timed decode (-d)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="the pair's speculative rows sampled at this temperature on both sides (0: greedy)")
    ap.add_argument("--rows", default=",".join(label for label, _, _ in ROWS), help="the equal-bits rows to run")
    ap.add_argument("--isa", choices=sorted(ISA_FLAGS), default="native",
                    help="avx2: both sides on their AVX2 code (llama.cpp rebuilt without AVX-512)")
    args = ap.parse_args()
    unknown = set(args.rows.split(",")) - {label for label, _, _ in ROWS}
    if unknown:
        ap.error(f"unknown --rows {', '.join(sorted(unknown))}: choose from {', '.join(label for label, _, _ in ROWS)}")
    if importlib.util.find_spec("sentencepiece") is None:  # llama.cpp's converter imports it for any vocabulary
        ap.error("llama.cpp's GGUF converter needs sentencepiece: pip install -e '.[llamacpp]'")
    torch.set_num_threads(args.threads)
    if args.isa != "native":
        os.environ["SPECLITE_CPU_ISA"] = args.isa  # read when the first kernel loads

    print(f"machine: {machine()}; compared on {args.isa} code (speclite's path: {cpu_build.isa()})", flush=True)
    source = llamacpp_source()
    t0 = time.perf_counter()
    bins = build_llamacpp(source, args.isa)
    print(f"llama.cpp {VERSION} (llama-cpp-python sdist) built in {bins} ({time.perf_counter() - t0:.0f} s)", flush=True)

    pair_dir = hub.resolve("tiny-code")
    rows = [] if args.pair_only else [row for row in ROWS if row[0] in args.rows.split(",")]
    model_dir = CACHE / f"{args.shape}-{args.layers or 'full'}"
    if rows and not (model_dir / "model.safetensors").exists():
        build_synthetic(args.shape, model_dir, layers=args.layers, tokenizer_from=pair_dir)
    ggufs = {kind: gguf(source, bins, model_dir, kind) for _, _, kind in rows}
    models = {}
    for label, quant, _ in rows:
        m = load_model(model_dir, device="cpu", dtype=torch.bfloat16)
        models[label] = quantize_model(m, quant, group_size=INT4_GROUP) if quant else m
        arena.settle(models[label])  # as LLM places a user's weights
    gen = torch.Generator().manual_seed(0)
    vocab = next(iter(models.values())).args.vocab_size if rows else 0
    context = torch.randint(0, vocab, (args.depth,), generator=gen).tolist() if rows else []
    prompt128 = torch.randint(0, vocab, (128,), generator=gen).tolist() if rows else []

    pair = None
    if not args.skip_pair:
        draft_dir = hub.resolve("tiny-code-draft")
        pair = {"target": gguf(source, bins, pair_dir, "f32"),
                "as llama": gguf(source, bins, target_for_llamacpp_drafters(pair_dir), "f32"),
                "drafters": {"tiny-code-draft": gguf(source, bins, draft_dir, "f32"),
                             "tiny-code-eagle3": gguf(source, bins, eagle3_for_llamacpp(hub.resolve("tiny-code-eagle3")),
                                                      "f32", pair_dir),
                             None: None},
                "plain": LLM("tiny-code", device="cpu"),
                **{label: LLM("tiny-code", device="cpu", speculative_config=config) for label, config in PAIR_METHODS}}

    results: dict[str, list[float]] = {}

    def record(key, value):
        results.setdefault(key, []).append(value)

    # Warm-up (kernel builds, first touch of the weights) and llama.cpp's fallbacks found before timing:
    # where its decode runs with no context, speclite's gets no more than the one token it needs.
    contexts = {}
    for label, _, kind in rows:
        speclite_decode(models[label], context, 4)
        llama_bench(bins, ggufs[kind], args.threads, "decode", args.depth)
        contexts[label] = context[:2] if FALLBACKS.get((ggufs[kind].name, "decode")) == 1 else context  # -d 0
    for r in range(args.rounds):
        record("copy", copy_bandwidth())
        for label, _, kind in rows:
            record(f"{label}/speclite/decode", speclite_decode(models[label], contexts[label], 64))
            record(f"{label}/llama/decode", llama_bench(bins, ggufs[kind], args.threads, "decode", args.depth))
            record(f"{label}/speclite/prefill", speclite_prefill(models[label], prompt128))
            record(f"{label}/llama/prefill", llama_bench(bins, ggufs[kind], args.threads, "prefill"))
        if pair:
            record("pair/speclite/plain", speclite_generate(pair["plain"], 128, args.temperature)[0])
            record("pair/llama/plain", llama_bench(bins, pair["target"], args.threads, "decode"))
            for label, _ in PAIR_METHODS:
                speed, rate = speclite_generate(pair[label], 128, args.temperature)
                record(f"pair/speclite/{label}", speed)
                record(f"pair/speclite/{label}/accepted", rate)
            record("pair/llama/speculative", llama_speculative(bins, pair["target"], pair["drafters"]["tiny-code-draft"],
                                                               args.threads, 4, 128, args.temperature))
            for label, spec_type, drafter, k, _ in LLAMA_PAIR_METHODS:
                speed, rate = llama_speculative_simple(bins, pair["as llama"], pair["drafters"][drafter], spec_type,
                                                       args.threads, k, 128, args.temperature)
                record(f"pair/llama/{label}", speed)
                record(f"pair/llama/{label}/accepted", rate)
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    m = {key: median(v) for key, v in results.items()}
    print(f"\n{args.threads} threads, median of {args.rounds} interleaved rounds")
    if rows:
        layers = args.layers or synthetic_config(args.shape)["num_hidden_layers"]
        print(f"\n{args.shape} shapes ({layers} layers), random weights; decode after {args.depth} tokens of context\n")
        print("| speclite vs llama.cpp | decode tok/s | llama.cpp | ratio | prefill tok/s | llama.cpp | ratio |")
        print("|---|---|---|---|---|---|---|")
    for label, _, kind in rows:
        d, ld = m[f"{label}/speclite/decode"], m[f"{label}/llama/decode"]
        p, lp = m[f"{label}/speclite/prefill"], m[f"{label}/llama/prefill"]
        print(f"| {label} vs {kind.upper().replace('-PURE', ' (pure)')} | {d:.1f} | {ld:.1f} | {d / ld:.2f} "
              f"| {p:.0f} | {lp:.0f} | {p / lp:.2f} |")
    # A shared machine's memory bandwidth can move between rounds, and the decode rows with it: each
    # round's ratios beside the copy bandwidth it started with (a Zen 4 VM: 0.98-1.04x bf16 at 32-35 GB/s,
    # 1.16-1.18x at ~50; benchmarks/RESULTS.md, 2026-11-26 17:13-).
    if rows:
        print("\nper round, decode ratio by the round's copy bandwidth: " + "; ".join(
            f"{bw:.0f} GB/s " + " ".join(f"{label} {results[f'{label}/speclite/decode'][r] / results[f'{label}/llama/decode'][r]:.2f}"
                                         for label, _, _ in rows)
            for r, bw in enumerate(results["copy"])))
    for (name, mode), i in sorted(FALLBACKS.items()):
        print(f"\nllama.cpp's {mode} of {name} ran as `llama-bench {' '.join(bench_tries(mode, args.depth)[i])}`"
              f"{' (speclite decoded after 1 token of context there)' if mode == 'decode' and i == 1 else ''}: "
              "the runs before it died of a signal here (see above)")
    if pair:
        print("\nembedded pair (tiny-code + tiny-code-draft; float32 in both: speclite on the CPU default, its "
              "bf16-valued weights held in 16 bits, llama.cpp GGUF f32), 128 tokens"
              + (f", speculative rows sampled at temperature {args.temperature}" if args.temperature else "") + "\n")
        print("| method | speclite tok/s | llama.cpp tok/s | ratio |")
        print("|---|---|---|---|")
        s, ll = m["pair/speclite/plain"], m["pair/llama/plain"]
        print(f"| plain vs llama-bench tg64 -d 32 | {s:.0f} | {ll:.0f} | {s / ll:.2f} |")
        ll = m["pair/llama/speculative"]
        for label, _ in PAIR_METHODS:
            s = m[f"pair/speclite/{label}"]
            print(f"| {label} vs llama-speculative --spec-draft-n-max 4 | {s:.0f} | {ll:.0f} | {s / ll:.2f} |")
        print("\nllama.cpp's own methods (llama-speculative-simple --spec-type, the same drafts converted), each "
              "against speclite's row of the same method:\n")
        print("| method | speclite tok/s | llama.cpp tok/s | ratio | drafts accepted: speclite, llama.cpp |")
        print("|---|---|---|---|---|")
        for label, spec_type, _, k, ours in LLAMA_PAIR_METHODS:
            s, ll = m[f"pair/speclite/{ours}"], m[f"pair/llama/{label}"]
            print(f"| {ours} vs {spec_type} --spec-draft-n-max {k} | {s:.0f} | {ll:.0f} | {s / ll:.2f} "
                  f"| {m[f'pair/speclite/{ours}/accepted']:.0%}, {m[f'pair/llama/{label}/accepted']:.0%} |")
        best = max(PAIR_METHODS, key=lambda method: m[f"pair/speclite/{method[0]}"])[0]
        theirs = max([("llama-speculative", m["pair/llama/speculative"])]
                     + [(spec_type, m[f"pair/llama/{label}"]) for label, spec_type, *_ in LLAMA_PAIR_METHODS],
                     key=lambda t: t[1])
        print(f"\nbest against best: speclite {best} {m[f'pair/speclite/{best}']:.0f} tok/s, llama.cpp {theirs[0]} "
              f"{theirs[1]:.0f} tok/s: {m[f'pair/speclite/{best}'] / theirs[1]:.2f}x")


if __name__ == "__main__":
    main()
