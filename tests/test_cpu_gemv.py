"""speclite's own bf16 CPU GEMV: built where the CPU has AVX-512 BF16, exact math, and a clean fallback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from speclite.kernels import cpu_gemv, linear


def _cpu_has_bf16() -> bool:
    try:
        return " avx512_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


needs_kernel = pytest.mark.skipif(not cpu_gemv.available(), reason="no AVX-512 BF16 CPU or no C++ compiler here")


def test_kernel_builds_where_the_cpu_and_compiler_allow():
    # On machines that can build it (the dev and CI machines can), a broken build must fail a test,
    # not silently fall back to torch.
    if _cpu_has_bf16() and shutil.which("g++"):
        assert cpu_gemv.available()


@needs_kernel
@pytest.mark.parametrize("n,k", [(1, 32), (7, 64), (100, 896), (4864, 896), (896, 4864), (13, 4096)])
def test_gemm_equals_float64_math_and_rows_do_not_depend_on_the_batch(n, k):
    torch.manual_seed(n + k)
    w = torch.randn(n, k, dtype=torch.bfloat16)
    x = torch.randn(5, k, dtype=torch.bfloat16)
    reference = x.double() @ w.double().t()
    y = cpu_gemv.gemm_bf16(x, w)
    assert y.dtype == torch.float32 and y.shape == (5, n)
    # bf16 products are exact in fp32; only the fp32 sums round.
    assert ((y.double() - reference).abs().max() / reference.abs().max()).item() < 1e-5
    for i in range(5):
        assert torch.equal(cpu_gemv.gemm_bf16(x[i:i + 1], w)[0], y[i])


@needs_kernel
def test_linear_routes_bf16_rows_through_it_and_keeps_torch_for_float32():
    torch.manual_seed(0)
    w = torch.randn(200, 128, dtype=torch.bfloat16)
    b = torch.randn(200, dtype=torch.bfloat16)
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    expected = cpu_gemv.gemm_bf16(x, w).to(torch.bfloat16) + b
    assert torch.equal(linear(x, w, b), expected)
    wf, xf = w.float(), x.float()
    assert torch.equal(linear(xf[:1], wf), torch.mv(wf, xf[0]).unsqueeze(0))


def _available_in_subprocess(tmp_path, **env) -> str:
    code = "from speclite.kernels import cpu_gemv, linear; import torch; print(cpu_gemv.available()); " \
           "w = torch.randn(8, 64, dtype=torch.bfloat16); print(linear(torch.ones(1, 64, dtype=torch.bfloat16), w).shape)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "SPECLITE_CACHE_DIR": str(tmp_path), **env})
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[0]


def test_switch_off_and_failed_build_fall_back_to_torch(tmp_path):
    assert _available_in_subprocess(tmp_path / "a", SPECLITE_CPU_KERNELS="0") == "False"
    assert _available_in_subprocess(tmp_path / "b", CXX="false") == "False"  # a compiler that fails
    assert not any((tmp_path / "b").rglob("*.so"))


@needs_kernel
def test_build_is_cached_per_machine(tmp_path):
    assert _available_in_subprocess(tmp_path) == "True"
    built = list(tmp_path.rglob("gemv-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    assert _available_in_subprocess(tmp_path) == "True"
    assert built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt
