"""MTP modules written as a separate checkpoint in the DeepSeek-V3 layout (load.py reads them back):
a trained module (scripts/train_heads.py), or a random one of the published shape for a target,
which `speclite bench --synthetic` runs (per-iteration cost depends on shapes only).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from speclite.model.decoder import ModelArgs
from speclite.speculate.mtp.module import MTPModule
from speclite.synthetic import random_weights


def save_module(tensors: dict[str, torch.Tensor], config: dict, out: Path) -> None:
    """Write a module: `tensors` under MTPModule's names (its block at model.layers.0, whose final
    norm DeepSeek-V3 calls shared_head.norm; no head: the target's), `config` the block's shape
    with num_nextn_predict_layers."""
    out.mkdir(parents=True, exist_ok=True)
    stored = {name.replace("model.norm.", "model.layers.0.shared_head.norm."): value.contiguous()
              for name, value in tensors.items()}
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def random_module(target: dict, out: Path, dtype, layers: int | None = None, device="cpu") -> None:
    """A random module of the published shape for a target of HF config `target`: one block of the
    target's own shape with enorm, hnorm and eh_proj, predicting through the target's lm_head
    (DeepSeek-V3's). A module has one block: `layers` is not used."""
    config = {**target, "num_hidden_layers": 1, "num_nextn_predict_layers": 1, "layer_types": ["full_attention"],
              "torch_dtype": str(dtype).removeprefix("torch.")}
    with torch.device("meta"):
        module = MTPModule(ModelArgs.from_hf(config), own_head=False, state_first=False, normed_state=False)
    save_module(random_weights(module, dtype, seed=4, device=device), config, out)
