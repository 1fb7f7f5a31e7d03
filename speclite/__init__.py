"""speclite: a quantization-first LLM runtime with lossless speculative decoding."""

import os

# Before torch loads libgomp (torch's own ops; speclite's kernels have their own team,
# kernels/cpu/team.h): its idle threads spin ~300k iterations before sleeping, and with another busy
# process on the machine every parallel region then waits for a starved spinner (decode measured
# 3-20x slower under load). A short spin keeps the idle speed (RESULTS.md, Threads).
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")
# torch's CPU allocator then puts tensors of 2 MB and more on transparent huge pages: a decode step
# reads every weight once, and on 4 KB pages each page costs a TLB miss (Qwen2.5-0.5B bf16 step,
# median 34.3 -> 32.4 ms; RESULTS.md). Read by torch at its first large allocation.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__all__ = ["LLM", "RequestOutput", "SamplingParams", "SpecConfig", "SpecliteError"]
__version__ = "0.1.0"
# Where each public name lives: imported on first use (they bring torch, a second or two), so the
# `speclite` command's entry point (speclite.launch) is running before that and can catch a Ctrl-C.
_HOMES = {"LLM": "speclite.api", "SpecConfig": "speclite.api", "RequestOutput": "speclite.engine.engine",
          "SamplingParams": "speclite.sampling", "SpecliteError": "speclite.errors"}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'speclite' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOMES[name]), name)
