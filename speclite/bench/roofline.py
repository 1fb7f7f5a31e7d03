"""The memory-bandwidth roofline of one decode step: weight bytes / measured copy bandwidth.

At batch 1 every decode step reads all the weights once, so no step can be faster than that;
the bandwidth is measured in the same run (a large tensor copy) rather than taken from a spec
sheet, so the comparison holds on whatever machine and load the bench ran under.
"""

from __future__ import annotations

import statistics
import time

import torch


def copy_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 5) -> float:
    """Bytes per second of a large device-to-device copy (each byte read once and written once)."""
    if nbytes is None:
        nbytes = (1 << 30) if device.type == "cuda" else (256 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults / allocation are not bandwidth
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 2 * src.nbytes / statistics.median(times)


def roofline(weight_bytes: int, bandwidth: float, measured_step_s: float | None) -> dict:
    bound = weight_bytes / bandwidth
    return {
        "weight_bytes": weight_bytes,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "roofline_step_s": bound,
        "measured_step_s": measured_step_s,
        "measured_over_roofline": measured_step_s / bound if measured_step_s else None,
    }
