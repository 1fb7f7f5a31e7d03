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


def step_bytes(model) -> int:
    """Bytes one batch-1 decode step reads: every weight, except that an input embedding not tied
    to the lm_head gives one row only (the roofline's numerator; model_bytes counts the whole table)."""
    if not isinstance(model, torch.nn.Module):
        model = model.model
    embed = model.model.embed_tokens.weight
    weight = getattr(getattr(model, "lm_head", None), "weight", None)  # a quantized head has none: not tied
    if weight is not None and weight.untyped_storage().data_ptr() == embed.untyped_storage().data_ptr():
        return model_bytes(model)
    return model_bytes(model) - embed.untyped_storage().nbytes() + embed[0].nbytes
