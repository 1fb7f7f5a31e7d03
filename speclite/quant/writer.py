"""Write a model directory: sharded safetensors + index, config.json, tokenizer and other files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from speclite.errors import SpecliteError

SHARD_BYTES = 2 * 1024**3
# Everything else at the top level of the source dir (tokenizer, generation config, chat template,
# README, license) is copied unchanged.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")


def prepare_out_dir(model_dir: Path, out_dir: Path) -> None:
    if out_dir.resolve() == model_dir.resolve():
        raise SpecliteError("the output directory must differ from the model directory")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise SpecliteError(f"output directory {out_dir} exists and is not empty: choose a new one")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".speclite-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise SpecliteError(f"cannot write to {out_dir}: {e.strerror or e}") from None


def write_model(out_dir: Path, model_dir: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t.contiguous()
        size += nbytes
    try:
        if len(shards) == 1:
            save_file(shards[0], str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        else:
            weight_map, total = {}, 0
            for i, shard in enumerate(shards, 1):
                file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(out_dir / file), metadata={"format": "pt"})
                for name, t in shard.items():
                    weight_map[name] = file
                    total += t.numel() * t.element_size()
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        (out_dir / "config.json").write_text(json.dumps(config, indent=2))
        for src in model_dir.iterdir():
            if src.is_file() and src.name != "config.json" and not src.name.endswith(WEIGHT_SUFFIXES) \
                    and not src.name.endswith(".index.json"):
                shutil.copy2(src, out_dir / src.name)
    except OSError as e:
        raise SpecliteError(f"writing {out_dir} failed: {e.strerror or e}") from None


def checkpoint_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
