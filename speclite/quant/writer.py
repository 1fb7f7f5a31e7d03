"""Write a model directory safely: shards streamed into a staging directory beside OUT, renamed at the end.

An interrupted run leaves at most a hidden staging directory without config.json (nothing loads it
as a model); the next run for the same OUT deletes it first.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import torch

from speclite.errors import SpecliteError

SHARD_BYTES = 2 * 1024**3
# Everything else at the top level of the source dir (tokenizer, generation config, chat template,
# README, license) is copied unchanged.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
# Free space kept beyond the checkpoint's own size (filesystem metadata, the copied tokenizer files).
DISK_MARGIN = 64 * 1024**2


def staging_dir(out_dir: Path) -> Path:
    return out_dir.parent / f".{out_dir.name}.speclite-partial"


def prepare_out_dir(model_dir: Path, out_dir: Path) -> Path:
    """Check OUT is new (or empty) and writable; return a fresh staging directory beside it."""
    if out_dir.resolve() == model_dir.resolve():
        raise SpecliteError("the output directory must differ from the model directory")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise SpecliteError(f"output directory {out_dir} exists and is not empty: choose a new one")
    staging = staging_dir(out_dir)
    try:
        shutil.rmtree(staging, ignore_errors=True)  # left by an interrupted run
        staging.mkdir(parents=True)
    except OSError as e:
        raise SpecliteError(f"cannot write to {out_dir.parent}: {e.strerror or e}") from None
    return staging


def check_free_space(directory: Path, needed: int) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed + DISK_MARGIN:
        raise SpecliteError(f"not enough disk space in {directory}: the checkpoint needs {needed / 1e9:.2f} GB, "
                            f"{free / 1e9:.2f} GB are free")


class ShardWriter:
    """Tensors appended to the current shard, which is written once the next tensor would overflow it.

    Peak memory is one shard's tensors; the shards get their final names (and the index) at close().
    """

    def __init__(self, directory: Path, shard_bytes: int = SHARD_BYTES):
        self.directory, self.shard_bytes = directory, shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.shards: list[tuple[Path, list[str]]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + nbytes > self.shard_bytes:
            self._flush()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += nbytes
        self.total_bytes += nbytes

    def adopt(self, path: Path, names: list[str], nbytes: int) -> None:
        """A shard another writer wrote (GPTQModel's) joins these: named and indexed with them at close()."""
        if self.pending:
            self._flush()
        partial = self.directory / f"partial-{len(self.shards) + 1:05d}.safetensors"
        path.rename(partial)
        self.shards.append((partial, list(names)))
        self.total_bytes += nbytes

    def _flush(self) -> None:
        path = self.directory / f"partial-{len(self.shards) + 1:05d}.safetensors"
        try:
            write_safetensors(path, self.pending, {"format": "pt"})
        except OSError as e:
            raise SpecliteError(f"writing {path} failed: {e.strerror or e}") from None
        self.shards.append((path, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> None:
        """Write the last shard, name the shards model-0000i-of-0000n (one: model.safetensors) + index."""
        if self.pending or not self.shards:
            self._flush()
        n = len(self.shards)
        weight_map = {}
        for i, (path, names) in enumerate(self.shards, 1):
            final = "model.safetensors" if n == 1 else f"model-{i:05d}-of-{n:05d}.safetensors"
            path.rename(self.directory / final)
            weight_map.update(dict.fromkeys(names, final))
        if n > 1:
            index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
            (self.directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


# torch dtype -> safetensors' name for it.
SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                      torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """The safetensors format (an 8-byte header length, the JSON header, the tensors' bytes in order),
    each tensor written straight from its own memory. safetensors' save_file first joins every tensor
    into one bytes object: a second copy of the whole shard at the peak."""
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for t in tensors.values():
            f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)


def finish(staging: Path, out_dir: Path, model_dir: Path, config: dict | None) -> None:
    """Copy the tokenizer and other files, write config.json LAST, then rename the directory into place.

    config None: the staging directory already holds its config.json (written by GPTQModel).
    """
    try:
        for src in model_dir.iterdir():
            if src.is_file() and src.name != "config.json" and not src.name.endswith(WEIGHT_SUFFIXES) \
                    and not src.name.endswith(".index.json") and not (staging / src.name).exists():
                shutil.copy2(src, staging / src.name)
        if config is not None:
            (staging / "config.json").write_text(json.dumps(config, indent=2))
        if out_dir.exists():  # checked empty at the start, and perhaps a shell's working directory: filled
            for entry in sorted(staging.iterdir(), key=lambda e: e.name == "config.json"):  # in place, config last
                os.replace(entry, out_dir / entry.name)
            staging.rmdir()
        else:
            os.replace(staging, out_dir)
    except OSError as e:
        raise SpecliteError(f"writing {out_dir} failed: {e.strerror or e}") from None


def checkpoint_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
