"""Regenerate speclite/data/calib_*.txt: calibration and held-out text for `speclite quantize`.

The text is the documentation (docstrings) of Python's own standard library, taken from the
running interpreter (PSF license), so it is license-clean and reproducible:
    python -m speclite.quant.make_calib_text
Modules alternate between the calibration part and the held-out part (every fifth module is
held out), so perplexity is measured on text the calibration never saw.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

MODULES = (
    "abc argparse array ast asyncio base64 bisect calendar collections contextlib copy csv dataclasses "
    "datetime decimal difflib email enum fractions functools glob gzip hashlib heapq hmac html http.client "
    "inspect io ipaddress itertools json logging math mimetypes numbers operator os pathlib pickle platform "
    "pprint queue random re sched secrets shlex shutil signal socket sqlite3 statistics string struct "
    "subprocess tarfile tempfile textwrap threading timeit tokenize traceback types typing unittest "
    "urllib.parse uuid warnings weakref xml.etree.ElementTree zipfile zlib"
).split()
TRAIN_BYTES, HELDOUT_BYTES = 240_000, 60_000
DATA = Path(__file__).resolve().parent.parent / "data"


def module_text(name: str) -> str:
    mod = importlib.import_module(name)
    parts = [f"Module {name}\n\n{inspect.getdoc(mod) or ''}"]
    for attr in sorted(vars(mod)):
        obj = getattr(mod, attr)
        if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        doc = inspect.getdoc(obj)
        if doc:
            parts.append(f"{name}.{attr}\n\n{doc}")
    return "\n\n".join(parts) + "\n\n"


def main() -> None:
    train, heldout = [], []
    for i, name in enumerate(MODULES):
        (heldout if i % 5 == 4 else train).append(module_text(name))
    DATA.mkdir(exist_ok=True)
    (DATA / "calib_train.txt").write_text("".join(train)[:TRAIN_BYTES])
    (DATA / "calib_heldout.txt").write_text("".join(heldout)[:HELDOUT_BYTES])


if __name__ == "__main__":
    main()
