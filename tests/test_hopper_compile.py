"""Every Triton kernel compiles for a Hopper GPU without one (tests/hopper_compile.py): what the host
functions would launch on an H100 / H200, through Triton's own compiler and ptxas, in a process of
its own (the CPU kernel tests switch this one's Triton to its interpreter)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Found, not imported: importing triton here, before the kernel test modules set TRITON_INTERPRET,
# would leave their kernels compiled-only in this process.
_triton = importlib.util.find_spec("triton")
if _triton is None or not (Path(_triton.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
    pytest.skip("needs Triton with its ptxas", allow_module_level=True)


def test_every_kernel_compiles_for_hopper_and_the_fast_tiles_keep_their_registers():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("hopper_compile.py")
    done = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "distinct launches compiled" in done.stdout
    for kernel in ("_w4a16_kernel", "_dense_kernel", "_fp8_block_gemm_kernel", "_int8_gemm_kernel", "_group_quant_fp8_kernel",
                   "_token_quant_int8_kernel", "_rms_norm_kernel", "_silu_mul_kernel",
                   "_rope_cache_kernel", "_static_mask_kernel", "_verify_rejection_kernel"):
        assert kernel in done.stdout
