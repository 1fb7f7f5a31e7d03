"""A model directory's tokenizer, through transformers; what goes wrong is one line."""

from __future__ import annotations

from pathlib import Path

from speclite.errors import SpecliteError
from speclite.model.validate import check_model_files

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_tokenizer(model_dir: Path, needed_for: str = ""):
    """`needed_for`: what the caller needs it for, said in the error (e.g. "calibration")."""
    from transformers import AutoTokenizer

    why = f"; {needed_for} needs one" if needed_for else ""
    check_model_files(model_dir)  # malformed JSON files are one line, not a transformers traceback
    # Without these files transformers 5 quietly builds an empty tokenizer that yields no ids.
    if not any((model_dir / f).exists() for f in TOKENIZER_FILES):
        raise SpecliteError(f"{model_dir} has no tokenizer files{why}")
    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError, TypeError) as e:
        said = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecliteError(f"{model_dir}: cannot load its tokenizer ({said}){why}") from None
