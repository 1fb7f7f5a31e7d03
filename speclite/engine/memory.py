"""Bytes a model holds resident (what chat and bench report as weights)."""

from __future__ import annotations

import torch


def model_bytes(model) -> int:
    """Bytes of parameters and buffers, each storage once (tied embeddings are one tensor).

    A wrapper around a model (the static CUDA-graph decoder) counts the model it wraps.
    """
    if not isinstance(model, torch.nn.Module):
        model = model.model
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total
