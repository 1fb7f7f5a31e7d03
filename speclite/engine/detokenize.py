"""Text of a growing token sequence without re-decoding all of it at every step."""

from __future__ import annotations


class IncrementalDetokenizer:
    """Decodes only a short window at the end: the tokens since the last emitted boundary.

    Decoding the window together with the tokens just before it keeps tokenizers that treat a
    sequence's first token specially (SentencePiece's leading space) consistent. A window whose text
    ends in a replacement character may end in a character whose last bytes have not arrived: that
    one character is held back (earlier replacement characters are bytes that can never form one,
    and are text like any other), and the window stays open until it ends in a whole character.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self.prefix = 0  # window start: tokens before it are settled
        self.read = 0  # tokens up to here are settled, their text in self.text
        self.shown = 0  # characters of the open window past the settled ones, already in self.text

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.ids[start:end], skip_special_tokens=True)

    def add(self, ids: list[int]) -> str:
        """Append tokens; return all settled text so far."""
        self.ids.extend(ids)
        before = self._decode(self.prefix, self.read)
        window = self._decode(self.prefix)
        held = window.endswith("\ufffd")
        ready = window[: len(window) - held]
        if len(ready) > len(before) + self.shown:
            self.text += ready[len(before) + self.shown :]
            self.shown = len(ready) - len(before)
        if not held and len(window) > len(before):
            self.prefix, self.read, self.shown = self.read, len(self.ids), 0
        return self.text

    def mark(self) -> tuple:
        """This point, to come back to with back_to (what came after it forgotten)."""
        return len(self.ids), self.text, self.prefix, self.read, self.shown

    def back_to(self, mark: tuple) -> None:
        n, self.text, self.prefix, self.read, self.shown = mark
        del self.ids[n:]

    def final(self) -> str:
        """The exact decoding of every token (including a trailing incomplete character)."""
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)
