"""Every Triton kernel of speclite compiled for a Hopper GPU (sm_90a) on a machine without one.

The kernels' own host functions run on CPU tensors with Triton's driver replaced by one that
names an sm_90 target and compiles each launch instead of running it: what compiles here is what
those functions would launch on an H100 / H200 (the argument types and alignments, the constexprs,
the launch options). Triton's bundled ptxas turns each into Hopper machine code, and its cuobjdump
reads the registers, stack frame (spills) and shared memory a program takes.

    python tests/hopper_compile.py            # a line per kernel launch: registers, spills, shared memory,
                                              # a GEMM's K-loop warp instructions per weight
    python tests/hopper_compile.py --quick    # fewer launch configs (tests/test_hopper_compile.py)

Exit 1 when a kernel fails to compile or a kernel that must not spill does. Run it with the
Triton the GPU machines have (3.6.0 on 2026-11's image) to find what their compiler rejects
before a GPU session: the first one found W8A8's int32 `tl.dot` failing there. TRITON_INTERPRET
must be unset (the CPU kernel tests set it: run this in a process of its own).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime import driver as runtime_driver
from triton.runtime.jit import JITFunction

HOPPER = GPUTarget("cuda", 90, 32)
SHARED_LIMIT = 227 * 1024  # the most shared memory one program may take on an H100 / H200
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


class HopperDriver(DriverBase):
    """Triton's driver with no GPU: the target is sm_90, and device / stream are placeholders."""

    @classmethod
    def is_active(cls):
        return True

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NotImplementedError

    def get_current_target(self):
        return HOPPER

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_benchmarker(self):
        raise NotImplementedError

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


@dataclass
class Launch:
    """One compiled launch: the kernel, its constexprs and options, and what a program takes."""
    name: str
    constexprs: dict
    num_warps: int
    num_stages: int
    registers: int
    stack_bytes: int  # per thread: spilled registers (and any stack arrays)
    shared_bytes: int
    loop: int  # warp instructions in its largest loop (a GEMM's K loop)


compiled: list = []  # (JITFunction name, its CompiledKernel, the launch's keywords), in launch order
_run = JITFunction.run


def _compile_only(self, *args, grid, warmup, **kwargs):
    kernel = _run(self, *args, grid=grid, warmup=True, **kwargs)
    compiled.append((self.fn.__name__, kernel, kwargs))
    return kernel


def resources(kernel) -> tuple[int, int, int]:
    """(registers, stack frame bytes: where spilled registers go) per thread, read from the cubin, and
    the instructions of its largest loop (a GEMM's K loop) in the machine code."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([str(BIN / "cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([str(BIN / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    regs, stack = re.search(r"REG:(\d+)", usage), re.search(r"STACK:(\d+)", usage)
    return int(regs.group(1)), int(stack.group(1)), largest_loop(sass)


def largest_loop(sass: str) -> int:
    """Instructions between a label and the furthest branch back to it (0: no loop)."""
    labels, count, longest = {}, 0, 0
    for line in sass.splitlines():
        label = re.match(r"\s*\.L_x_(\d+):", line)
        if label:
            labels[label.group(1)] = count
        elif re.match(r"\s*/\*[0-9a-f]+\*/", line):
            back = re.search(r"BRA\s.*\.L_x_(\d+)", line)
            if back and back.group(1) in labels:
                longest = max(longest, count - labels[back.group(1)] + 1)
            count += 1
    return longest


def per_weight(launch: "Launch") -> float | None:
    """A GEMM's K-loop warp instructions per weight it streams: one iteration works BLOCK_N x BLOCK_K
    weights with num_warps warps. A Hopper scheduler issues one warp instruction a cycle, so on an H200
    (132 SMs x 4 schedulers x 1.98 GHz) a loop at c per weight tops out at 1.05e12 / c weights a second
    (int4 at 80% of its 4.2 TB/s copy bandwidth: c <= 0.16)."""
    c = launch.constexprs
    if "BLOCK_K" not in c or not launch.loop:
        return None
    return launch.loop * launch.num_warps / (c["BLOCK_N"] * c["BLOCK_K"])


def launches(quick: bool) -> None:
    """Call every Triton host function with the launch configs and dtypes it can be given."""
    from speclite.kernels import (attention_triton, dense_triton, fp8_block_triton, gpu_layer_ops_triton,
                                  int8_triton, tuning, verify_triton, w4a16_triton)
    from speclite.kernels.tuning import GemmConfig

    def configs(m):
        cands = tuning.gemm_candidates(m, lambda bk: 64)
        if quick:  # one split per tile shape (the split is not a constexpr): the same compiles
            cands = list({(c.block_m, c.block_n, c.block_k): c for c in cands}.values())
            cands = cands[:: 3] if m > tuning.GEMV_ROWS else cands
        return [GemmConfig(c.block_m, c.block_n, c.block_k, min(c.split_k, 2), c.num_warps, c.num_stages) for c in cands]

    dtypes = (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16, torch.float32)
    k, n, group = 512, 256, 128
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m in (1, 128):
            x, bias = torch.randn(m, k).to(dtype), torch.randn(n).to(dtype)
            qweight = torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int64).to(torch.int32)
            qzeros = torch.randint(-2**31, 2**31 - 1, (k // group, n // 8), dtype=torch.int64).to(torch.int32)
            scales = torch.rand(k // group, n).half()
            act_order = (torch.randperm(k) // group).int()
            for cfg in configs(m) if dtype in dtypes else configs(m)[:1]:
                for g_idx in (None, act_order):
                    w4a16_triton.w4a16_gemm(x, qweight, qzeros, scales, g_idx, group, bias, config=cfg)
            if m <= tuning.GEMV_ROWS:
                dense_weight = torch.randn(n, k).to(dtype)
                for cfg in configs(m) if dtype in dtypes else configs(m)[:1]:
                    dense_triton.dense_gemm(x, dense_weight, bias, cfg)
                dense_triton.dense_gemm(x, dense_weight, None, configs(m)[0])
            if dtype != torch.float32:
                weight = torch.randn(n, k).to(torch.float8_e4m3fn)
                scale_inv = torch.rand(n // 128, k // 128)
                xq, xs = fp8_block_triton.per_token_group_quant_fp8(x, 128)
                for cfg in configs(m) if dtype in dtypes else configs(m)[:1]:
                    if 128 % cfg.block_k == 0:
                        fp8_block_triton.fp8_block_gemm_quantized(xq, xs, weight, scale_inv, (128, 128), dtype, bias, cfg)
                w8 = torch.randint(-127, 128, (n, k), dtype=torch.int8)
                xq8, xs8 = int8_triton.per_token_quant_int8(x)
                for cfg in configs(m) if dtype in dtypes else configs(m)[:1]:
                    int8_triton.int8_gemm_quantized(xq8, xs8, w8, torch.rand(n, 1), dtype, bias, cfg)
        d, heads, kv = 128, 4, 2
        rows = torch.randn(3, 896).to(dtype)
        for quant in (None, ("fp8", 128), ("int8", None)) if dtype != torch.float32 else (None,):
            gpu_layer_ops_triton.rms_norm(rows, torch.rand(896).to(dtype), 1e-6, None, quant)
            gpu_layer_ops_triton.rms_norm(rows, torch.rand(896).to(dtype), 1e-6, torch.randn(3, 896).to(dtype), quant)
            gpu_layer_ops_triton.silu_mul(torch.randn(3, 2 * 4864).to(dtype), quant)
        qkv = torch.randn(3, (heads + 2 * kv) * d).to(dtype)
        cos, sin = torch.rand(2, 3, d).to(dtype)
        cache_k, cache_v = torch.zeros(2, kv, 64, d, dtype=dtype)
        norms = ((torch.rand(d).to(dtype), torch.rand(d).to(dtype)), 1e-6)
        for start, qk_norm in ((5, ()), (torch.arange(5, 8), ()), (torch.arange(5, 8), norms)):
            gpu_layer_ops_triton.rope_cache(qkv, cos, sin, cache_k, cache_v, start, heads, kv, qk_norm)
        qkv = torch.randn(3, (28 + 2 * 4) * d).to(dtype)  # Qwen2.5-7B's heads: 7 a KV head
        cache_k, cache_v = torch.zeros(2, 4, 1024, d, dtype=dtype)
        for start, mask, qk_norm in ((300, None, ()), (torch.arange(300, 303), torch.ones(3, 512, dtype=torch.bool), ()),
                                     (300, None, norms)):
            attention_triton.attention(qkv, cos, sin, cache_k, cache_v, start, mask, 28, qk_norm)
        if dtype != torch.float32:  # its output quantized for an FP8 o_proj too
            attention_triton.attention(qkv, cos, sin, cache_k, cache_v, 300, None, 28, (), ("fp8", 128))
    tree = torch.ones(3, 3, dtype=torch.bool).tril()
    for window in (None, 4096):
        gpu_layer_ops_triton.static_mask(torch.arange(5, 8), torch.arange(5, 8), tree, 512, window)
    vocab, drafts = 1000, 4
    p = torch.rand(drafts + 1, vocab)
    verify_triton.verify_rejection(torch.randint(0, vocab, (drafts,)), torch.rand(drafts, vocab), p,
                                   torch.rand(drafts), torch.rand(()))
    verify_triton.verify_rejection(torch.randint(0, vocab, (drafts,)), None, p, torch.rand(drafts), torch.rand(()))


# Kernels whose every launch must keep its registers (a spill is a local-memory round trip in the
# inner loop): the per-token layer ops and the 16-bit attention, and W4A16 tiles inside one group with whole packed words.
def must_not_spill(launch: Launch) -> bool:
    c = launch.constexprs
    if launch.name == "_w4a16_kernel":
        return c["TILE_IN_ONE_GROUP"] and c["BLOCK_K"] >= 128 and c["BLOCK_M"] == 16
    if launch.name == "_attention_kernel":  # float32 models (the tests' pair) dot in ieee fp32: slow either way
        return c["DOT_PRECISION"] != "ieee"
    return launch.name in ("_rms_norm_kernel", "_silu_mul_kernel", "_rope_cache_kernel", "_static_mask_kernel")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one launch config per tile shape, fewer dtypes")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET is set: kernels would be interpreted, not compiled", file=sys.stderr)
        return 2
    runtime_driver.set_active(HopperDriver())
    JITFunction.run = _compile_only
    failed = []
    try:
        launches(args.quick)
    except Exception as e:  # the launch that failed to compile is the last one attempted
        failed.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    seen, rows = set(), []
    for name, kernel, kwargs in compiled:
        meta = kernel.metadata
        constexprs = {k: v for k, v in kwargs.items() if k.isupper()}
        key = (name, tuple(sorted(constexprs.items())), meta.num_warps, meta.num_stages)
        if key in seen:
            continue
        seen.add(key)
        regs, stack, loop = resources(kernel)
        rows.append(Launch(name, constexprs, meta.num_warps, meta.num_stages, regs, stack, meta.shared, loop))
    print(f"triton {triton.__version__}, target sm_{HOPPER.arch}: {len(rows)} distinct launches compiled")
    for r in rows:
        flags = []
        if r.stack_bytes and must_not_spill(r):
            flags.append("SPILLS")
            failed.append(f"{r.name} {r.constexprs} spills {r.stack_bytes} bytes a thread")
        if r.shared_bytes > SHARED_LIMIT:
            flags.append("too much shared memory (the tuner skips it)")
        consts = " ".join(f"{k}={v}" for k, v in r.constexprs.items())
        weight = per_weight(r)
        print(f"{r.name:24} {consts:90} w{r.num_warps} s{r.num_stages} regs {r.registers:3} "
              f"stack {r.stack_bytes:5} shared {r.shared_bytes:6} "
              f"{'' if weight is None else f'K loop {weight:.3f}/weight'} {' '.join(flags)}")
    for f in failed:
        print("FAILED", f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
