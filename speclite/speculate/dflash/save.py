"""DFlash drafters written in the published layout (load.py reads them back): a trained drafter
(scripts/train_dflash.py), or a random one of the published shape for a target, which `speclite
bench --synthetic` runs (per-iteration cost depends on shapes only).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from speclite.model.decoder import ModelArgs
from speclite.speculate.dflash.draft import DFlashDraft
from speclite.speculate.dflash.load import ARCHITECTURE
from speclite.synthetic import random_weights

# The published Qwen3-8B drafter's shape (z-lab/Qwen3-8B-DFlash-b16): five layers of the target's
# width reading five target layers spread from layer 1 to L - 3, blocks of 16.
PUBLISHED_LAYERS, PUBLISHED_TARGET_LAYERS, PUBLISHED_BLOCK = 5, 5, 16


def save_drafter(tensors: dict[str, torch.Tensor], config: dict, out: Path) -> None:
    """Write a drafter: `tensors` under DFlashDraft's names (the `model.` prefix is not stored: the
    published layout has no embedding or head), `config` its config.json."""
    out.mkdir(parents=True, exist_ok=True)
    stored = {name.removeprefix("model."): value.contiguous() for name, value in tensors.items()}
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def target_layer_ids(num_layers: int, count: int = PUBLISHED_TARGET_LAYERS) -> list[int]:
    """`count` target layers evenly from 1 to L - 3 (the published drafters' choice: [1, 9, 17, 25,
    33] of Qwen3-8B's 36), fewer where the target has fewer layers."""
    last = max(num_layers - 3, 1)
    return sorted({min(round(1 + i * (last - 1) / (count - 1)), num_layers - 1) for i in range(count)})


def random_drafter(target: dict, out: Path, dtype, layers: int | None = None, device="cpu") -> None:
    """A random drafter of the published shape for a target of HF config `target` (`layers` of its
    own: fewer than the published five, for a quick run); the mask token is the last id."""
    t = ModelArgs.from_hf(target)
    n = layers or PUBLISHED_LAYERS
    config = {"architectures": [ARCHITECTURE], "model_type": "qwen3", "hidden_size": t.hidden_size,
              "intermediate_size": t.intermediate_size, "num_hidden_layers": n, "num_attention_heads": t.num_heads,
              "num_key_value_heads": t.num_kv_heads, "head_dim": t.head_dim, "vocab_size": t.vocab_size,
              "rms_norm_eps": t.rms_norm_eps, "max_position_embeddings": t.max_position_embeddings,
              "rope_theta": t.rope["rope_theta"], "attention_bias": False, "tie_word_embeddings": False,
              "layer_types": ["full_attention"] * n, "num_target_layers": t.num_layers,
              "dtype": str(dtype).removeprefix("torch."),
              "dflash_config": {"target_layer_ids": target_layer_ids(t.num_layers), "block_size": PUBLISHED_BLOCK,
                                "mask_token_id": t.vocab_size - 1}}
    ids = tuple(config["dflash_config"]["target_layer_ids"])
    with torch.device("meta"):
        draft = DFlashDraft(ModelArgs.from_hf({**config, "architectures": ["Qwen3ForCausalLM"]}), ids,
                            PUBLISHED_BLOCK, t.vocab_size - 1)
    save_drafter(random_weights(draft, dtype, seed=3, device=device), config, out)
