"""A checkpoint read one tensor at a time (memory-mapped safetensors), never all at once."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from speclite.model.loader import weight_files
from speclite.model.validate import DTYPE_BYTES

_LAYER = re.compile(r"model\.layers\.(\d+)\.")


class TensorSource:
    """Tensor names, shapes and sizes from the headers; get() reads one tensor.

    Every get() maps its file anew and the tensor it returns holds the only reference to that
    mapping: once the caller drops the tensor its pages leave the process (resident memory and
    RLIMIT_DATA both count a mapping's touched pages while it lives), whatever the file's size.
    """

    def __init__(self, model_dir: Path):
        self._file_of: dict[str, Path] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.nbytes: dict[str, int] = {}
        for file in weight_files(model_dir):
            try:
                with safe_open(str(file), framework="pt") as f:
                    for name in f.keys():
                        part = f.get_slice(name)
                        self._file_of[name] = file
                        self.shapes[name] = tuple(part.get_shape())
                        self.nbytes[name] = _element_bytes(part.get_dtype()) * _numel(self.shapes[name])
            except (SafetensorError, OSError, RuntimeError) as e:
                raise _corrupt(file, e) from None

    def names(self) -> list[str]:
        """Everything outside the decoder blocks first, then block by block (what block streaming needs)."""
        def key(name):
            m = _LAYER.match(name)
            return (-1, name) if m is None else (int(m.group(1)), name)

        return sorted(self._file_of, key=key)

    def files(self) -> dict[str, Path]:
        """Each tensor's file."""
        return dict(self._file_of)

    def layer_names(self, i: int) -> list[str]:
        prefix = f"model.layers.{i}."
        return [n for n in self._file_of if n.startswith(prefix)]

    def get(self, name: str) -> torch.Tensor:
        file = self._file_of[name]
        try:
            with safe_open(str(file), framework="pt") as f:
                return f.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise _corrupt(file, e) from None


def layer_index(name: str) -> int | None:
    m = _LAYER.match(name)
    return None if m is None else int(m.group(1))


def _corrupt(where, e: Exception):
    from speclite.errors import SpecliteError

    return SpecliteError(f"{where} is corrupt or truncated ({e}); delete it and download it again")


def _element_bytes(dtype: str) -> int:
    return DTYPE_BYTES.get(str(dtype).upper(), 4)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
