"""EAGLE-3 heads written in the SpecForge layout (load.py reads them back): a trained head
(scripts/train_heads.py), or a random one of the published shape for a target, which `speclite
bench --synthetic` runs (per-iteration cost depends on shapes only).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from speclite.model.decoder import ModelArgs
from speclite.speculate.eagle3.head import Eagle3Head
from speclite.speculate.eagle3.load import PREFIXES, SPECFORGE
from speclite.synthetic import random_weights

# Eagle3Head's module names -> SpecForge's (the vLLM speculators prefix "layers.0." is not written).
NAMES = {module: stored for stored, module in PREFIXES.items() if stored != "layers.0."}
# The published heads' draft vocabulary (SpecForge's and the EAGLE-3 authors' Llama-3.1-8B heads).
PUBLISHED_DRAFT_VOCAB = 32000


def save_head(tensors: dict[str, torch.Tensor], target_ids: torch.Tensor, config: dict, out: Path) -> None:
    """Write a head: `tensors` under Eagle3Head's names, `target_ids` the target id of each draft id
    (stored as d2t offsets with the t2d mask), `config` its SpecForge config.json."""
    out.mkdir(parents=True, exist_ok=True)
    stored = {}
    for name, value in tensors.items():
        prefix = next(p for p in NAMES if name.startswith(p))
        stored[NAMES[prefix] + name[len(prefix):]] = value.contiguous()
    stored["d2t"] = target_ids - torch.arange(len(target_ids))  # target id = draft id + d2t[draft id]
    t2d = torch.zeros(config["vocab_size"], dtype=torch.bool)
    t2d[target_ids] = True
    stored["t2d"] = t2d
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def random_head(target: dict, out: Path, dtype, layers: int | None = None, device="cpu") -> None:
    """A random head of the published shape for a target of HF config `target`: one Llama layer of
    the target's width, heads and MLP, a draft vocabulary of 32000 (or the target's, if smaller),
    reading the default layers (2, L // 2, L - 3); a target of fewer than 4 layers gets (0, L // 2,
    L - 1). A head has one layer: `layers` is not used."""
    t = ModelArgs.from_hf(target)
    n = t.num_layers
    draft_vocab = min(PUBLISHED_DRAFT_VOCAB, t.vocab_size)
    config = {"architectures": [SPECFORGE], "model_type": "llama", "hidden_size": t.hidden_size,
              "intermediate_size": t.intermediate_size, "num_attention_heads": t.num_heads,
              "num_key_value_heads": t.num_kv_heads, "head_dim": t.head_dim, "num_hidden_layers": 1,
              "rms_norm_eps": t.rms_norm_eps, "rope_theta": t.rope["rope_theta"],
              "max_position_embeddings": t.max_position_embeddings, "vocab_size": t.vocab_size,
              "draft_vocab_size": draft_vocab, "target_hidden_size": t.hidden_size, "tie_word_embeddings": False,
              "torch_dtype": str(dtype).removeprefix("torch.")}
    aux = (2, n // 2, n - 3) if n >= 4 else (0, n // 2, n - 1)
    if n < 4:  # a first id other than 1 names layer inputs (load.py)
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux)}
    with torch.device("meta"):
        head = Eagle3Head(ModelArgs.from_hf({**config, "architectures": ["LlamaForCausalLM"]}), draft_vocab,
                          3 * t.hidden_size, aux)
    save_head(random_weights(head, dtype, seed=2, device=device), torch.arange(draft_vocab), config, out)
