"""Peak resident memory and wall time of `speclite quantize` per scheme, on random-weight models of real shapes.

Each shape is built from its shipped config (speclite.synthetic, bf16, one safetensors file, the
bundled tiny-code tokenizer for calibration) in a child process; each scheme runs `speclite quantize ... --no-eval` in
its own process, whose peak RSS comes from wait4(). MB/s is input checkpoint MB over that process's
whole wall time (interpreter start and imports included); phase MB/s over the time quantize itself
reports for reading, quantizing and writing the weights (its summary's "quantized linears ... in S s").

    python benchmarks/quantize.py --shapes qwen2.5-0.5b,qwen2.5-1.5b --schemes int4,fp8-block,w8a8,gptq,awq
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


TOKENIZER = Path(__file__).resolve().parent.parent / "speclite" / "assets" / "tiny-code"


def run(cmd: list[str]) -> tuple[int, float, float, float | None]:
    """(exit code, wall s, peak RSS MB, seconds of quantize's weights phase) of one child process."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        # Files, not pipes: wait4() below does not read, and a full pipe would stall the child.
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except KeyboardInterrupt:
            proc.kill()
            raise
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            print(f"  failed ({code}): {err.read()[-800:]}", file=sys.stderr)
        phase = re.search(r"quantized linears.*? in ([0-9.]+) s", out.read())
    return code, wall, usage.ru_maxrss / 1024, float(phase.group(1)) if phase else None  # Linux reports KiB


def mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.glob("*.safetensors")) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b", help="shipped configs (speclite/configs)")
    ap.add_argument("--schemes", default="int4,fp8-block,w8a8,gptq", help="rtn schemes, and gptq / awq (int4)")
    ap.add_argument("--layers", type=int, default=None, help="fewer decoder layers (default: the config's)")
    ap.add_argument("--gptq-samples", type=int, default=8, help="calibration windows for gptq and awq")
    ap.add_argument("--gptq-seq-len", type=int, default=128)
    ap.add_argument("--shard-size", type=int, default=2048, help="output shard MB (quantize's default)")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    args = ap.parse_args()

    root = Path(args.dir or tempfile.mkdtemp(prefix="speclite-quantize-bench-"))
    baseline_cmd = [sys.executable, "-c", "import torch, transformers, speclite.cli, speclite.quant.quantize"]
    _, _, baseline, _ = run(baseline_cmd)
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; {os.cpu_count()} cores; "
          f"interpreter + torch + transformers + speclite imported: {baseline:.0f} MB RSS")
    print(f"{'shape':<14} {'scheme':<10} {'ckpt MB':>8} {'out MB':>7} {'shard MB':>9} {'peak RSS MB':>12} "
          f"{'wall s':>7} {'MB/s':>6} {'phase s':>8} {'phase MB/s':>11}")
    for shape in args.shapes.split(","):
        src = root / shape
        if not (src / "config.json").exists():
            # Built in a child too: this process stays small, since a child's peak RSS can include
            # the parent's pages from before its exec.
            subprocess.run([sys.executable, "-c", "import sys; from speclite.synthetic import build_synthetic; "
                            "build_synthetic(sys.argv[1], sys.argv[2], layers=int(sys.argv[3]) or None, "
                            "tokenizer_from=sys.argv[4])", shape, str(src), str(args.layers or 0), str(TOKENIZER)],
                           check=True)
        for scheme in args.schemes.split(","):
            out = root / f"{shape}-{scheme}"
            shutil.rmtree(out, ignore_errors=True)
            cmd = [sys.executable, "-m", "speclite.cli", "quantize", str(src), "-o", str(out), "--no-eval",
                   "--shard-size", str(args.shard_size)]
            if scheme in ("gptq", "awq"):
                cmd += ["--scheme", "int4", "--method", scheme, "--calib-samples", str(args.gptq_samples),
                        "--seq-len", str(args.gptq_seq_len)]
            else:
                cmd += ["--scheme", scheme]
            code, wall, peak, phase = run(cmd)
            if code == 0:
                shard = max(f.stat().st_size for f in out.glob("*.safetensors")) / 1e6
                phase_cols = f"{phase:>8.1f} {mb(src) / max(phase, 0.05):>11.0f}" if phase else f"{'?':>8} {'?':>11}"
                print(f"{shape:<14} {scheme:<10} {mb(src):>8.0f} {mb(out):>7.0f} {shard:>9.0f} {peak:>12.0f} "
                      f"{wall:>7.1f} {mb(src) / wall:>6.0f} {phase_cols}", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
