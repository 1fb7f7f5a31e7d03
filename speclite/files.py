"""Writing a file the user keeps (a saved chat, a suffix cache, a batch's output) without losing it, and
finding out before a long run that it can be written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from speclite.errors import SpecliteError


def check_writable(path: Path, flag: str) -> None:
    """Before a long run: `path` (what `flag` names) can be written. Opened, not judged by permissions
    (root may write anywhere but /proc and the like); a file the check made is removed again."""
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        raise SpecliteError(f"cannot write {flag} {path}: {e.strerror or 'not a writable file location'}") from None
    if not existed:
        path.unlink()


def write_atomic(path: Path, data: bytes) -> None:
    """`data` into a file of its own beside `path` (two writers never share one), synced, then renamed
    over it: a write that fails or is interrupted leaves the previous file whole (OSError propagates;
    nothing half-written remains). A link is written through: its target is replaced, the link stays."""
    path = Path(os.path.realpath(path))
    fd, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(staged, path.stat().st_mode & 0o777 if path.exists() else 0o644)  # (mkstemp's is 0600)
        os.replace(staged, path)
    finally:
        if os.path.exists(staged):  # gone already after the rename
            os.unlink(staged)
