"""Medusa heads written in vLLM's layout (load.py reads them back): trained heads
(scripts/train_heads.py), or random ones of the published shape for a target, which `speclite bench
--synthetic` runs (per-iteration cost depends on shapes only).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from speclite.model.decoder import ModelArgs
from speclite.speculate.medusa.head import MedusaHeads
from speclite.synthetic import random_weights

# MedusaHeads' names -> vLLM's.
NAMES = ((re.compile(r"heads\.(\d+)\.layers\.(\d+)\."), r"blocks.\1.layers.\2."),
         (re.compile(r"heads\.(\d+)\.lm_head\."), r"lm_heads.\1."))
# The published Medusa-1 heads (FasterDecoding's Vicuna-7B ones): five heads of one residual block,
# each with its own lm_head.
PUBLISHED_HEADS, PUBLISHED_BLOCKS = 5, 1


def save_heads(tensors: dict[str, torch.Tensor], config: dict, out: Path) -> None:
    """Write heads: `tensors` under MedusaHeads' names, `config` vLLM's (model_type "medusa")."""
    out.mkdir(parents=True, exist_ok=True)
    stored = {}
    for name, value in tensors.items():
        for pattern, replacement in NAMES:
            name = pattern.sub(replacement, name)
        stored[name] = value.contiguous()
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def random_heads(target: dict, out: Path, dtype, layers: int | None = None, device="cpu") -> None:
    """Random heads of the published shape for a target of HF config `target`: five heads of one
    residual block (with bias) over its hidden size, each with its own lm_head over its vocabulary.
    `layers` is not used."""
    t = ModelArgs.from_hf(target)
    config = {"model_type": "medusa", "num_heads": PUBLISHED_HEADS, "num_hidden_layers": PUBLISHED_BLOCKS,
              "hidden_size": t.hidden_size, "vocab_size": t.vocab_size, "medusa_fc_bias": True,
              "original_lm_head": False}
    with torch.device("meta"):
        heads = MedusaHeads(t, PUBLISHED_HEADS, PUBLISHED_BLOCKS, bias=True)
    save_heads(random_weights(heads, dtype, seed=5, device=device), config, out)
