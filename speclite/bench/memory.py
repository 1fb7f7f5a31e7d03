"""Peak memory per configuration, and the whole process's peak.

Every model of a bench run stays loaded for the whole run, so a process-wide figure (RSS, or
CUDA's allocated total) would charge plain decoding for the draft too. A configuration's peak is
therefore what it uses, resident: its models' weights plus their preallocated KV caches; on CUDA
plus the transient peak measured above that during its runs (max_memory_allocated after a reset,
minus what was allocated when its runs began). The CPU has no per-configuration transient figure.
"""

from __future__ import annotations

import resource
import sys

import torch


def process_peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


class MemoryMeter:
    def __init__(self, device: torch.device):
        self.device = device
        self.kind = "weights+KV+CUDA transient" if device.type == "cuda" else "weights+KV"
        self.base = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)

    def transient_peak(self) -> int:
        if self.device.type != "cuda":
            return 0
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(self.device) - self.base
