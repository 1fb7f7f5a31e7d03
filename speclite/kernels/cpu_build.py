"""Builds speclite's C++ CPU kernels (kernels/cpu/*.cpp) on first use and picks the ISA path.

Each source is compiled once per machine with the system C++ compiler into
$SPECLITE_CACHE_DIR (default ~/.cache/speclite)/cpu-kernels and loaded with ctypes (a build takes
a few seconds). Where there is no compiler, the CPU lacks the source's instructions, or
SPECLITE_CPU_KERNELS=0, a library is None and callers keep torch's ops.

Which path runs is decided at run time from the CPU's flags: the AVX-512 BF16 GEMV where the CPU
has it, the AVX2 kernels everywhere with AVX2 + FMA + F16C. SPECLITE_CPU_ISA=avx2 turns the
AVX-512 path off, so an AVX-512 machine runs (and tests) the AVX2 kernels.
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

SOURCES = Path(__file__).parent / "cpu"
ISA_FLAGS = {"avx512_bf16": {"avx512f", "avx512_bf16"}, "avx2": {"avx2", "fma", "f16c"}}


def has(isa: str) -> bool:
    """Whether the kernels for `isa` ("avx512_bf16" or "avx2") may run here."""
    if os.environ.get("SPECLITE_CPU_KERNELS", "1") == "0" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    if isa != "avx2" and os.environ.get("SPECLITE_CPU_ISA", "").lower() == "avx2":
        return False
    return ISA_FLAGS[isa] <= set(_cpu_flags().decode().split())


def load(isa: str, source: str, flags: tuple[str, ...], signatures: dict[str, list]) -> ctypes.CDLL | None:
    """The `isa` kernels of kernels/cpu/`source` with each function's ctypes argtypes set, or None
    where they may not run (see has) or do not build."""
    lib = library(source, flags) if has(isa) else None
    for name, argtypes in signatures.items() if lib is not None else ():
        getattr(lib, name).argtypes = argtypes
    return lib


@functools.cache
def library(source: str, flags: tuple[str, ...]) -> ctypes.CDLL | None:
    """kernels/cpu/`source` built with `flags` (cached per source, flags, compiler and CPU), or None."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        return None
    path = SOURCES / source
    # -march=native ties a binary to this CPU: the CPU's flags are part of the cache key, and so are
    # the headers the sources share.
    headers = b"".join(h.read_bytes() for h in sorted(SOURCES.glob("*.h")))
    key = hashlib.sha256(path.read_bytes() + headers + " ".join(flags).encode() + compiler.encode()
                         + _cpu_flags()).hexdigest()[:16]
    cache = Path(os.environ.get("SPECLITE_CACHE_DIR", Path.home() / ".cache" / "speclite")) / "cpu-kernels"
    target = cache / f"{path.stem}-{key}.so"
    if not target.exists() and not _build(compiler, path, flags, target):
        return None
    return ctypes.CDLL(str(target))  # torch is loaded first, so its OpenMP runtime serves this one too


def _build(compiler: str, source: Path, flags, target: Path) -> bool:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            done = subprocess.run([compiler, *flags, str(source), "-o", str(out)], capture_output=True, timeout=300)
            if done.returncode != 0:
                return False  # e.g. the CPU lacks the source's instructions: it refuses to build
            os.replace(out, target)  # atomic: concurrent builders never load a half-written file
        return True
    except (OSError, subprocess.SubprocessError):
        return False


@functools.cache
def _cpu_flags() -> bytes:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor().encode()
    return next((line for line in text.splitlines() if line.startswith("flags")), "").encode()
