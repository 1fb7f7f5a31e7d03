"""Calibration and held-out text -> token windows for GPTQ, SmoothQuant and perplexity."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from speclite.errors import SpecliteError

DATA = Path(__file__).resolve().parent.parent / "data"
SHIPPED_CALIB = DATA / "calib_train.txt"
SHIPPED_HELDOUT = DATA / "calib_heldout.txt"


def read_text(path: str | Path) -> str:
    """A plain text file, or JSONL whose lines carry "text" or "prompt"; documents joined by blank lines."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecliteError(f"cannot read calibration file {path}: {e}") from None
    if path.suffix.lower() not in (".jsonl", ".json"):
        text = raw
    else:
        docs = []
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SpecliteError(f"{path}:{n}: not valid JSON ({e})") from None
            doc = row.get("text", row.get("prompt")) if isinstance(row, dict) else None
            if not isinstance(doc, str):
                raise SpecliteError(f"{path}:{n}: a calibration line needs a \"text\" or \"prompt\" string")
            docs.append(doc)
        text = "\n\n".join(docs)
    if not text.strip():
        raise SpecliteError(f"calibration file {path} holds no text")
    return text


def token_windows(tokenizer, text: str, seq_len: int, max_windows: int) -> list[torch.Tensor]:
    """Consecutive, non-overlapping windows of seq_len tokens (the last may be shorter)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = torch.tensor(ids[: seq_len * max_windows], dtype=torch.long)
    return [w for w in ids.split(seq_len) if w.numel() > 1]
