"""Random-weight model directories of real shapes, built from a config with no download.

Per-forward latency, memory and loop overhead depend on shapes, not on trained weights, so a
Qwen2.5-7B-shaped model of random numbers measures them on any machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from speclite.errors import SpecliteError
from speclite.model.decoder import ModelArgs, Transformer
from speclite.quant.writer import ShardWriter, check_free_space

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def synthetic_config(name: str) -> dict:
    """A shipped config by name (e.g. qwen2.5-7b) or a path to a config.json."""
    path = CONFIG_DIR / f"{name.lower()}.json"
    if not path.exists():
        path = Path(name)
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))
        raise SpecliteError(f"unknown synthetic config '{name}': use one of {shipped} or a config.json path")
    return json.loads(path.read_text())


def narrow_transformer(name: str, **overrides) -> Transformer:
    """A Transformer of a shipped config's family (its RoPE, biases, norms) with the widths and layer count
    in overrides, random weights (seed 0), on the CPU: the family's code at a size that runs in a moment."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs.from_hf(synthetic_config(name) | overrides)).eval()
    nn.init.normal_(model.model.embed_tokens.weight)  # built undrawn (Backbone)
    model.init_rope("cpu")
    return model


def random_weights(model: nn.Module, dtype, seed: int, skip: tuple[str, ...] = (), device="cpu") -> dict[str, torch.Tensor]:
    """Every parameter of `model` but those named in `skip` (built on the meta device: only names and
    shapes are read) as random numbers of std 0.02, the norms' weights at 1, drawn in the order of
    named_parameters by a generator on `device` (a GPU draws a 7B model's in a second, a CPU core
    takes a minute; the numbers differ between devices), returned on the CPU."""
    return dict(_drawn(model, dtype, seed, skip, device))


def _drawn(model: nn.Module, dtype, seed: int, skip: tuple[str, ...], device) -> Iterator[tuple[str, torch.Tensor]]:
    """random_weights' (name, tensor) pairs, each drawn when it is asked for."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name not in skip:
            yield name, (torch.ones(p.shape, dtype=dtype) if name.endswith("norm.weight")
                         else (torch.randn(p.shape, generator=gen, device=device) * 0.02).to(dtype).cpu())


def build_synthetic(name: str, out_dir: str | Path, layers: int | None = None, dtype=torch.bfloat16,
                    seed: int = 0, tokenizer_from: str | Path | None = None, device="cpu") -> Path:
    """Write config.json and random safetensors (std 0.02, norms at 1; drawn on `device`, see
    random_weights) for config `name` into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = synthetic_config(name)
    if layers:
        cfg["num_hidden_layers"] = layers
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    with torch.device("meta"):
        model = Transformer(ModelArgs.from_hf(cfg))
    # Drawn and written a shard at a time: a 7B model's 15 GB drawn whole, then joined into one more
    # copy by save_file, took a 24 GB machine down before the loader's memory check could speak.
    skip = ("lm_head.weight",) if cfg.get("tie_word_embeddings") else ()
    elem = torch.empty((), dtype=dtype).element_size()
    check_free_space(out, sum(p.numel() * elem for name, p in model.named_parameters() if name not in skip))
    shards = ShardWriter(out)
    for name, tensor in _drawn(model, dtype, seed, skip, device):
        shards.add(name, tensor)
    shards.close()
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if tokenizer_from is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(tokenizer_from)).save_pretrained(out)
    return out
