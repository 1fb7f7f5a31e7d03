"""Builds speclite's C++ CPU kernels (kernels/cpu/*.cpp) on first use and picks the ISA path.

Each source is compiled once per machine and ISA with the system C++ compiler into
$SPECLITE_CACHE_DIR (default ~/.cache/speclite)/cpu-kernels and loaded with ctypes (a build takes
a few seconds). Where there is no compiler, the CPU lacks AVX2 + FMA + F16C, or
SPECLITE_CPU_KERNELS=0, a library is None and callers keep torch's ops.

One ISA path serves the whole process, picked at run time from the CPU's flags (`isa()`): `amx`
where the CPU also has AMX tiles with int8 and bf16 (Sapphire Rapids and later: the integer products
of many rows, and a drafter's bf16 products, in tile multiplies, the rest as avx512; where the kernel
refuses the process AMX's state, the avx512 code of the same build runs), `avx512` where it has AVX-512 F/BW/VL with VNNI (Intel since
Cascade Lake, AMD Zen 4 and later: integer dot products in one vpdpbusd), else `avx2`. The sources are
the same; the build's flags decide which code each kernel compiles to (`path_flags`: the AVX-512 paths
add AVX-512 BF16 where the CPU has it: on Zen 4, bf16 weights times bf16 or a drafter's activations). SPECLITE_CPU_ISA=avx512 or
avx2 caps it, so an AMX or AVX-512 machine runs (and tests) the lesser paths' kernels.
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
# ISA path -> (CPU flags it needs, compiler flags), best first.
_AVX512 = ({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"},
           ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"))
ISAS = {
    "amx": (_AVX512[0] | {"amx_tile", "amx_int8", "amx_bf16"}, _AVX512[1] + ("-mamx-tile", "-mamx-int8", "-mamx-bf16")),
    "avx512": _AVX512,
    "avx2": ({"avx2", "fma", "f16c"}, ("-mavx2", "-mfma", "-mf16c")),
}
# -ffp-contract=off: the compiler may not fuse a multiply and an add differently in different tiles.
# -falign-loops=64: every loop starts a cache line, so a memory-bound loop's speed stops moving with
# unrelated code around it (int4/int4 decode steps 0.90x when the dense panels were added to the same
# source, 0.97x with the alignment; benchmarks/RESULTS.md, 2026-11-26).
FLAGS = ("-O3", "-pthread", "-ffp-contract=off", "-shared", "-fPIC", "-std=c++17", "-falign-loops=64")


def runnable() -> list[str]:
    """The ISA paths this CPU can run, best first (none with SPECLITE_CPU_KERNELS=0 or off x86)."""
    if os.environ.get("SPECLITE_CPU_KERNELS", "1") == "0" or platform.machine() not in ("x86_64", "AMD64"):
        return []
    flags = set(_cpu_flags().decode().split())
    return [name for name, (needs, _) in ISAS.items() if needs <= flags]


@functools.cache
def isa() -> str | None:
    """The process's ISA path: the best runnable one, or SPECLITE_CPU_ISA's if it can run here."""
    paths = runnable()
    asked = os.environ.get("SPECLITE_CPU_ISA", "").lower()
    if asked in paths:
        return asked
    return paths[0] if paths else None


_loaded: dict[tuple[str, str | None], ctypes.CDLL | None] = {}
_typed: set[tuple] = set()  # (id of a loaded library, function names) whose argtypes are set


def load(source: str, signatures: dict[str, list]) -> ctypes.CDLL | None:
    """kernels/cpu/`source` built for the process's ISA path (isa()), or the best lesser one that
    builds, with the ctypes argtypes of `signatures`' functions set; None where none may run or
    builds. Kept per source and path: the tests switch paths (isa.cache_clear() after setting
    SPECLITE_CPU_ISA)."""
    key = (source, isa())
    if key not in _loaded:
        lib, paths = None, runnable()
        # A path that does not build (a compiler older than its flags, e.g. -mamx-tile) gives way to the
        # next; one that builds only without AVX-512 BF16 is built without it (the FMAs instead).
        tries = [flags for path in (paths[paths.index(key[1]):] if key[1] else ())
                 for flags in dict.fromkeys((path_flags(path), ISAS[path][1]))]
        for flags in tries:
            lib = library(source, flags + vendor_flags() + FLAGS)
            if lib is not None:
                break
        _loaded[key] = lib
    lib = _loaded[key]
    if lib is not None and (id(lib), tuple(signatures)) not in _typed:  # several modules load one library
        for name, argtypes in signatures.items():
            getattr(lib, name).argtypes = argtypes
        _typed.add((id(lib), tuple(signatures)))
    return lib


@functools.cache
def library(source: str, flags: tuple[str, ...]) -> ctypes.CDLL | None:
    """kernels/cpu/`source` built with `flags` (cached per source, headers, flags and compiler), or None."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        return None
    path = SOURCES / source
    headers = b"".join(h.read_bytes() for h in sorted(SOURCES.glob("*.h")))
    key = hashlib.sha256(path.read_bytes() + headers + " ".join(flags).encode() + compiler.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("SPECLITE_CACHE_DIR", Path.home() / ".cache" / "speclite")) / "cpu-kernels"
    target = cache / f"{path.stem}-{key}.so"
    if not target.exists() and not _build(compiler, path, flags, target):
        return None
    return ctypes.CDLL(str(target))


def _build(compiler: str, source: Path, flags, target: Path) -> bool:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            done = subprocess.run([compiler, *flags, str(source), "-o", str(out)], capture_output=True, timeout=300)
            if done.returncode != 0:
                return False
            os.replace(out, target)  # atomic: concurrent builders never load a half-written file
        return True
    except (OSError, subprocess.SubprocessError):
        return False


def path_flags(path: str) -> tuple[str, ...]:
    """An ISA path's compiler flags, with -mavx512bf16 on the AVX-512 paths where the CPU has it (gemm.h's
    vdpbf16ps tiles, DotBf16, on Zen 4 and later)."""
    bf16 = path != "avx2" and b"avx512_bf16" in _cpu_flags().split()
    return ISAS[path][1] + (("-mavx512bf16",) if bf16 else ())


def vendor_flags() -> tuple[str, ...]:
    """Defines for what is tuned per CPU maker and generation rather than per ISA path (gemm.h,
    PREFETCH_ONE_ROW and FAR_PREFETCH): -DSPECLITE_AMD on AMD's, and -DSPECLITE_ZEN4 on AMD's with
    AVX-512 (Zen 4 and later), whichever path a process runs there."""
    if _cpu_line("vendor_id").split()[-1:] != [b"AuthenticAMD"]:
        return ()
    return ("-DSPECLITE_AMD", "-DSPECLITE_ZEN4") if b"avx512f" in _cpu_flags().split() else ("-DSPECLITE_AMD",)


def _cpu_flags() -> bytes:
    return _cpu_line("flags") or (b"" if Path("/proc/cpuinfo").exists() else platform.processor().encode())


@functools.cache
def _cpu_line(key: str) -> bytes:
    """The first line of /proc/cpuinfo that starts with `key` (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return b""
    return next((line for line in text.splitlines() if line.startswith(key)), "").encode()
