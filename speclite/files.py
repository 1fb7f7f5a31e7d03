"""Writing a file the user keeps (a saved chat, a suffix cache, a batch's output) without losing it."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """`data` into a file beside `path`, synced, then renamed over it: a write that fails or is
    interrupted leaves the previous file whole (OSError propagates; nothing half-written remains)."""
    staged = path.with_name(path.name + ".tmp")
    try:
        with open(staged, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, path)
    finally:
        staged.unlink(missing_ok=True)  # gone already after the rename
