import os
import subprocess
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (speclite.kernels imports it lazily)

import torch

import speclite.kernels as K
from speclite.kernels import dispatch


def run_python(code, **env):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_force_torch_switch_and_cpu_routing():
    x = torch.randn(2, 8)
    before = dispatch.torch_forced()
    try:
        K.force_torch(True)
        assert dispatch.torch_forced() and not dispatch.use_triton(x)
        K.force_torch(False)
        assert not dispatch.torch_forced()
        assert not dispatch.use_triton(x)  # CPU tensors always take the torch path
    finally:
        K.force_torch(before)


def test_env_var_forces_torch_and_import_leaves_triton_alone():
    code = "import sys, speclite.kernels.dispatch as d; print(d.torch_forced(), 'triton' in sys.modules)"
    assert run_python(code, SPECLITE_FORCE_TORCH="1") == "True False"


def test_every_kernel_runs_on_cpu_without_triton_installed():
    code = """
import sys
sys.modules["triton"] = None  # as if not installed: find_spec gives None, import raises
import torch
import speclite.kernels as K
from speclite.kernels.dispatch import triton_available
assert not triton_available()
x = torch.randn(3, 64)
qweight = torch.randint(-2**31, 2**31 - 1, (8, 16), dtype=torch.int32)
qzeros = torch.randint(-2**31, 2**31 - 1, (2, 2), dtype=torch.int32)
print(K.w4a16_gemm(x, qweight, qzeros, torch.rand(2, 16).half(), None, 32).shape)
w8 = torch.randn(16, 64).to(torch.float8_e4m3fn)
print(K.fp8_block_gemm(x, w8, torch.rand(1, 1)).shape, K.per_token_group_quant_fp8(x)[1].shape)
print(K.int8_gemm(x, torch.randint(-127, 128, (16, 64), dtype=torch.int8), torch.rand(16, 1)).shape)
print(K.per_token_quant_int8(x)[1].shape)
p = torch.softmax(torch.randn(3, 10), -1)
print([int(v) for v in K.verify_rejection(torch.tensor([1, 2]), p[:2], p, torch.rand(2), 0.5)])
print([int(v) for v in K.verify_greedy(torch.tensor([1, 2]), p)])
"""
    lines = run_python(code).splitlines()
    assert lines[0] == "torch.Size([3, 16])"
    assert lines[1] == "torch.Size([3, 16]) torch.Size([3, 1])"
    assert lines[2] == "torch.Size([3, 16])" and lines[3] == "torch.Size([3, 1])"
    assert len(lines) == 6
