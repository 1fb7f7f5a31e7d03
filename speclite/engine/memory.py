"""Bytes a model holds resident (what chat and bench report as weights)."""

from __future__ import annotations

import torch


def model_bytes(model) -> int:
    """Bytes of parameters and buffers, each tensor once (tied embeddings are one tensor; models
    whose weights share one arena, speclite.model.arena, count their own tensors only).

    A wrapper around a model (the static CUDA-graph decoder) counts the model it wraps.
    """
    if not isinstance(model, torch.nn.Module):
        model = model.model
    seen = {(t.data_ptr(), t.nbytes) for t in list(model.parameters()) + list(model.buffers())}
    return sum(nbytes for _, nbytes in seen)


def step_bytes(model) -> int:
    """Bytes one batch-1 decode step reads: every weight, except that an input embedding not tied
    to the lm_head gives one row only (the roofline's numerator; model_bytes counts the whole table)."""
    if not isinstance(model, torch.nn.Module):
        model = model.model
    embed = model.model.embed_tokens.weight
    weight = getattr(getattr(model, "lm_head", None), "weight", None)  # a quantized head has none: not tied
    if weight is not None and weight.data_ptr() == embed.data_ptr():
        return model_bytes(model)
    return model_bytes(model) - embed.nbytes + embed[0].nbytes
