"""A model directory's tokenizer, through transformers; what goes wrong is one line."""

from __future__ import annotations

from pathlib import Path

from speclite.errors import SpecliteError
from speclite.model.validate import check_model_files

# The files that hold a vocabulary (tokenizer_config.json alone does not: transformers then builds a
# tokenizer of a few special tokens that turns every prompt into nothing).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def load_tokenizer(model_dir: Path, needed_for: str = ""):
    """`needed_for`: what the caller needs it for, said in the error (e.g. "calibration")."""
    from transformers import AutoTokenizer

    why = f"; {needed_for} needs one" if needed_for else ""
    check_model_files(model_dir)  # malformed JSON files are one line, not a transformers traceback
    if not any((model_dir / f).exists() for f in TOKENIZER_FILES):
        raise SpecliteError(f"{model_dir} has no tokenizer files ({', '.join(TOKENIZER_FILES)}){why}")
    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError, TypeError) as e:
        said = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecliteError(f"{model_dir}: cannot load its tokenizer ({said}){why}") from None
