"""float32 models on the CPU keep the weights that are exact in 16 bits in 16 bits: same numbers, half the bytes.

Most checkpoints are stored in bf16, and speclite runs float32 on the CPU by default, so loading
widens every weight to 4 bytes though each value is a bf16 one. The CPU kernels (cpu_gemm) take
bf16 and f16 weights under fp32 activations: they widen them in registers, which is exact, and
multiply in fp32 as they do fp32 weights. So a dense linear whose values all survive the round trip
to a 16-bit type is stored in it: the products are the fp32 weights' bit for bit on every ISA path
(one sum over K in order, only the load widens; gemm.h, Dense). A decode step then streams half the bytes (plain decoding on an AMX Xeon: the
embedded pair 1.63x, a bf16 Qwen2.5-0.5B-shaped checkpoint run in float32 1.83x; RESULTS.md).

Only speclite's dense `Linear` (its forward casts for torch's ops where the kernels do not run) and
embedding tables (a lookup's rows are widened to the activations' dtype: the decoder, the drafting
heads and the C greedy chains read them so), on the CPU, where the kernels are built. Norms stay:
their dtype is the activations' (Transformer.dtype).
"""

from __future__ import annotations

import torch
from torch import nn

from speclite.kernels import cpu_gemm
from speclite.kernels.dense import HALF
from speclite.model.decoder import Linear


def narrow(*models: nn.Module) -> int:
    """Store the float32 CPU `Linear` weights and embedding tables of each model in bf16 (else f16)
    where every one of them is exact in it; a model with one that is not keeps them all (a layer's
    projections meet in one kernel call, one dtype). A weight several modules share (a head tied to
    its table) is narrowed once and stays shared. One tensor at a time, each let go once replaced:
    memory peaks at the model plus 1.5x its largest tensor (the check's copies), not 1.5x the model
    (Qwen2.5-0.5B shape: +0.78 GB over 1.9 GB). Returns the bytes saved. Call before the first
    forward (as arena.settle)."""
    if not cpu_gemm.available():
        return 0
    saved = 0
    for model in models:
        holders: dict[int, list[nn.Module]] = {}  # id of a weight -> the modules holding it
        for m in model.modules():
            # A weight already 16-bit was narrowed with another model sharing it (a drafter's view with
            # a head of its own, speclite.speculate.token_map): the rest of this model is decided alone.
            if type(m) in (Linear, nn.Embedding) and m.weight.dtype not in HALF:
                holders.setdefault(id(m.weight), []).append(m)
        weights = [mods[0].weight for mods in holders.values()]
        if not weights or not all(w.device.type == "cpu" and w.dtype == torch.float32 and not w.requires_grad
                                  for w in weights):
            continue
        # bf16 first: it holds every value of a bf16 checkpoint, f16 those of an f16 one.
        half = next((h for h in HALF if all(torch.equal(w.to(h).float(), w) for w in weights)), None)
        del weights
        if half is None:
            continue
        for mods in holders.values():
            new = nn.Parameter(mods[0].weight.to(half), requires_grad=False)
            saved += new.nbytes
            for m in mods:
                m.weight = new
    return saved
