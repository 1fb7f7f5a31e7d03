#!/usr/bin/env bash
# The GPU runs of issues 20, 14 and 16, in stages that each fit one device command (10 minutes):
#   bash benchmarks/gpu_session.sh tests|kernels|decode|loop|heads
# Each stage appends its output to STAGE.log (and JSON where the bench writes one) under $OUT, the
# device tool's folder that comes back (./gpu_out elsewhere). The device image has torch, triton,
# transformers, click and rich but no speclite install: the checkout is put on PYTHONPATH.
set -uo pipefail
stage=${1:-}
case "$stage" in
  tests|kernels|decode|loop|heads) ;;
  *) echo "usage: $0 tests|kernels|decode|loop|heads" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
log="$out/$stage.log"
run() { echo "== $*" | tee -a "$log"; "$@" 2>&1 | tee -a "$log"; }

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv >>"$log" 2>&1
case "$stage" in
  tests)  # compiled kernels against their torch paths; every method's greedy output against plain decoding
    run python3 -m pytest -m cuda -p no:cacheprovider -rs ;;
  kernels)  # W4A16 / FP8-block / W8A8 GEMMs and the verify kernel vs torch's ops and copy bandwidth
    run python3 benchmarks/kernels.py ;;
  decode)  # a decode step vs the roofline and transformers, bf16 / int4 / fp8 targets, CUDA graphs
    run python3 benchmarks/decode.py --synthetic qwen2.5-7b --device cuda --static --quant none,int4,fp8-block \
      --hf-static --max-new-tokens 128 ;;
  loop)  # loop overhead: the 7B target with a 0.5B draft, every iteration k+1 tokens
    run python3 -m speclite.cli bench --synthetic qwen2.5-7b --synthetic-draft qwen2.5-0.5b --device cuda --static \
      --sp-type naive,vanilla,deterministic --k 2,4,8 --accept-policy accept_all --max-new-tokens 128 --repeats 3 \
      --json "$out/loop.json" ;;
  heads)  # published-shape EAGLE-3 head and DFlash drafter on the 7B target (issues 14, 16)
    run python3 -m speclite.cli bench --synthetic qwen2.5-7b --device cuda --static --sp-type eagle3,dflash \
      --k 2,4,8 --accept-policy accept_all --max-new-tokens 128 --repeats 3 --json "$out/heads.json" ;;
esac
