#!/usr/bin/env bash
# The GPU runs of issues 20, 14 and 16, in stages that each fit one device command (10 minutes):
#   bash benchmarks/gpu_session.sh tests|kernels|decode|decode-hf|loop|heads
#   bash benchmarks/gpu_session.sh all [STAGE:SECONDS ...]   # several stages in one command, each
#       stopped after its seconds; default tests:170 kernels:140 decode:270 (from what they took on an
#       H200 with a cold Triton cache, 2026-11-26; kernels.py has a dense row since), then
#       loop:300 heads:250 as a second command
# Each stage appends its output to STAGE.log (and JSON where the bench writes one) under $OUT, the
# device tool's folder that comes back (./gpu_out elsewhere). The device image has torch, triton,
# transformers, click and rich but no speclite install: the checkout is put on PYTHONPATH.
# bitsandbytes is not in the image, and its wheel (43 MB) does not travel beside the tree: unpack it
# here with only its CUDA 13 libraries (8 MB) and name .whl in the device call's carry:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_24_x86_64 \
#     -d /tmp/whl bitsandbytes==0.50.2 && mkdir -p .whl/site && unzip -q -d .whl/site /tmp/whl/bitsandbytes-*.whl \
#     && find .whl/site -name 'libbitsandbytes_*.so' ! -name '*cuda13*' -delete
set -uo pipefail
stage=${1:-}
case "$stage" in
  tests|kernels|decode|decode-hf|loop|heads|all) ;;
  *) echo "usage: $0 tests|kernels|decode|decode-hf|loop|heads|all [STAGE:SECONDS ...]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
[ -d .whl/site ] && export PYTHONPATH=$PWD/.whl/site:$PYTHONPATH
log="$out/$stage.log"
run() { echo "== $*" | tee -a "$log"; "$@" 2>&1 | tee -a "$log"; }

if [ "$stage" = all ]; then
  shift
  [ $# -gt 0 ] || set -- tests:170 kernels:140 decode:270
  for pair in "$@"; do
    echo "== ${pair%%:*}: at most ${pair#*:}s" >>"$out/all.log"
    timeout -k 5 "${pair#*:}" bash "$0" "${pair%%:*}"
    echo "== ${pair%%:*}: rc $? after ${SECONDS}s" >>"$out/all.log"
  done
  exit 0
fi

{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv
  python3 -c "import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__)"
} >>"$log" 2>&1
case "$stage" in
  tests)  # compiled kernels against their torch paths; every method's greedy output against plain decoding
    # Triton compiles each launch config once per process: 12 workers compile side by side.
    extra="$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout 150") $(python3 -c "import xdist" 2>/dev/null && echo "-n 12")"
    run python3 -m pytest -m cuda -p no:cacheprovider -rs --durations 15 $extra ;;
  kernels)  # attention, dense / W4A16 / FP8-block / W8A8 GEMMs and the verify kernel vs torch's ops and copy bandwidth
    run python3 benchmarks/kernels.py --reps 20 ;;
  decode)  # a decode step vs the roofline and transformers, bf16 / int4 / fp8 targets, CUDA graphs
    quants=none,int4,fp8-block
    python3 -c "import bitsandbytes" 2>/dev/null && quants=$quants,nf4
    run python3 benchmarks/decode.py --synthetic qwen2.5-7b --device cuda --static --quant $quants \
      --max-new-tokens 128 --repeats 2 ;;
  decode-hf)  # the same against transformers' static cache + torch.compile
    run python3 benchmarks/decode.py --synthetic qwen2.5-7b --device cuda --static --quant none,int4 \
      --hf-static --max-new-tokens 128 ;;
  loop)  # loop overhead: the 7B target with a 0.5B draft, every iteration k+1 tokens
    run python3 -m speclite.cli bench --synthetic qwen2.5-7b --synthetic-draft qwen2.5-0.5b --device cuda --static \
      --sp-type naive,vanilla,deterministic --k 2,4,8 --accept-policy accept_all --max-new-tokens 64 --repeats 2 \
      --prompts builtin:code --json "$out/loop.json" ;;
  heads)  # published-shape EAGLE-3 head and DFlash drafter on the 7B target (issues 14, 16)
    run python3 -m speclite.cli bench --synthetic qwen2.5-7b --device cuda --static --sp-type eagle3,dflash \
      --k 2,4,8 --accept-policy accept_all --max-new-tokens 64 --repeats 2 --prompts builtin:code \
      --json "$out/heads.json" ;;
esac
