"""Text of a growing token sequence without re-decoding all of it at every step."""

from __future__ import annotations


class IncrementalDetokenizer:
    """Decodes only a short window at the end: the tokens since the last emitted boundary.

    Decoding the window together with the tokens just before it keeps tokenizers that treat a
    sequence's first token specially (SentencePiece's leading space) consistent; a window whose
    text ends in an incomplete UTF-8 sequence is held back until its last byte arrives.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self.prefix = 0  # window start: tokens before it are settled
        self.read = 0  # tokens up to here are in self.text

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.ids[start:end], skip_special_tokens=True)

    def add(self, ids: list[int]) -> str:
        """Append tokens; return all settled text so far."""
        self.ids.extend(ids)
        before = self._decode(self.prefix, self.read)
        window = self._decode(self.prefix)
        if len(window) > len(before) and not window.endswith("\ufffd"):
            self.text += window[len(before):]
            self.prefix, self.read = self.read, len(self.ids)
        return self.text

    def final(self) -> str:
        """The exact decoding of every token (including a trailing incomplete character)."""
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)
