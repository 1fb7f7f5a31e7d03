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

from speclite.api import LLM, SpecConfig
from speclite.engine.engine import RequestOutput
from speclite.sampling import SamplingParams
from speclite.errors import SpecliteError

__all__ = ["LLM", "RequestOutput", "SamplingParams", "SpecConfig", "SpecliteError"]
__version__ = "0.1.0"
