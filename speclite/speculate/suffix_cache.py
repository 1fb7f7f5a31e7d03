"""The global suffix cache: earlier responses in one suffix tree, oldest evicted first, and its file.

The file (`--suffix-cache FILE`) is JSON: {"format": "speclite-suffix-cache", "version": 1,
"vocab_size": V, "responses": [[token ids], ...]} oldest first. It holds the responses, not the
tree: loading re-inserts them, so a file stays valid whatever --suffix-max-tree-depth is.
"""

from __future__ import annotations

import json
from array import array
from collections import deque
from pathlib import Path

from speclite.errors import SpecliteError
from speclite.files import write_atomic
from speclite.speculate.suffix_tree import SuffixTree

FORMAT, VERSION = "speclite-suffix-cache", 1


class ResponseCache:
    def __init__(self, max_depth: int, max_requests: int):
        self.max_depth, self.max_requests = max_depth, max_requests  # -1: unbounded, 0: off
        self.forget()

    def forget(self) -> None:
        """Drop everything learned (only ever on an explicit request: reset() keeps it)."""
        self.tree = SuffixTree(self.max_depth)
        self.responses: deque[array] = deque()

    @property
    def tokens(self) -> int:
        return sum(len(r) for r in self.responses)

    def add(self, response) -> None:
        if self.max_requests == 0 or not response:
            return
        self.responses.append(self.tree.start(response).seq)
        while 0 < self.max_requests < len(self.responses):
            self.tree.remove(self.responses.popleft())

    def save(self, path: Path, vocab_size: int) -> None:
        """Write atomically: an interrupted save leaves the previous file intact."""
        body = {"format": FORMAT, "version": VERSION, "vocab_size": vocab_size,
                "responses": [r.tolist() for r in self.responses]}
        try:
            write_atomic(path, json.dumps(body, separators=(",", ":")).encode())
        except OSError as e:
            raise SpecliteError(f"cannot write --suffix-cache {path}: {e.strerror or e}") from None


def read_responses(path: Path, vocab_size: int) -> list[list[int]]:
    """The responses a cache file holds, checked; any problem is one SpecliteError line."""
    where = f"--suffix-cache {path}"
    try:
        body = json.loads(path.read_bytes())
    except OSError as e:
        raise SpecliteError(f"cannot read {where}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SpecliteError(f"{where} is not a speclite suffix cache (not JSON)") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise SpecliteError(f"{where} is not a speclite suffix cache (no '{FORMAT}' header)")
    if body.get("version") != VERSION:
        raise SpecliteError(f"{where} has version {body.get('version')!r}; this speclite reads version {VERSION}")
    if body.get("vocab_size") != vocab_size:
        raise SpecliteError(
            f"{where} was written for a vocabulary of {body.get('vocab_size')!r} tokens, this model has {vocab_size}"
        )
    responses = body.get("responses")
    if not isinstance(responses, list) or not all(
        isinstance(r, list) and all(type(t) is int and 0 <= t < vocab_size for t in r) for r in responses
    ):
        raise SpecliteError(f"{where} is corrupt: responses must be lists of token ids below {vocab_size}")
    return responses
