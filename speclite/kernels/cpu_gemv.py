"""speclite's own CPU matrix-vector kernel (kernels/cpu/gemv.cpp): one bf16 row times bf16 weights.

Built once per machine with the system C++ compiler (-march=native) into ~/.cache/speclite and
loaded with ctypes; a build takes about two seconds. Where there is no compiler, no AVX-512 BF16,
or SPECLITE_CPU_KERNELS=0, `available()` is False and callers keep torch's ops. Measured on the
2-core dev CPU (benchmarks/cpu_gemv.py): the Qwen2.5-0.5B decode matmuls stream at ~22-24 GB/s
against torch.mv's ~20-21.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).parent / "cpu" / "gemv.cpp"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
_P = ctypes.c_void_p
_I = ctypes.c_int


def available() -> bool:
    return _library() is not None


def gemv_bf16(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """One bf16 row x [K] times bf16 w [N, K]^T on the CPU, K % 32 == 0, both contiguous: fp32 [N]."""
    n, k = w.shape
    y = torch.empty(n, dtype=torch.float32)
    _library().speclite_gemv_bf16(w.data_ptr(), x.data_ptr(), y.data_ptr(), n, k, torch.get_num_threads())
    return y


@functools.cache
def _library():
    if os.environ.get("SPECLITE_CPU_KERNELS", "1") == "0" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        return None
    source = SOURCE.read_bytes()
    # -march=native ties the binary to this CPU: the CPU's flags are part of the cache key.
    key = hashlib.sha256(source + " ".join(FLAGS).encode() + compiler.encode() + _cpu_flags()).hexdigest()[:16]
    cache = Path(os.environ.get("SPECLITE_CACHE_DIR", Path.home() / ".cache" / "speclite")) / "cpu-kernels"
    target = cache / f"gemv-{key}.so"
    if not target.exists() and not _build(compiler, target):
        return None
    lib = ctypes.CDLL(str(target))  # torch is loaded first, so its OpenMP runtime serves this one too
    lib.speclite_gemv_bf16.argtypes = [_P, _P, _P, _I, _I, _I]
    return lib


def _build(compiler: str, target: Path) -> bool:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(out)], capture_output=True, timeout=300)
            if done.returncode != 0:
                return False  # e.g. no AVX-512 BF16 here: the source refuses to build
            os.replace(out, target)  # atomic: concurrent builders never load a half-written file
        return True
    except (OSError, subprocess.SubprocessError):
        return False


def _cpu_flags() -> bytes:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor().encode()
    return next((line for line in text.splitlines() if line.startswith("flags")), "").encode()
