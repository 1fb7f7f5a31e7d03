"""One chat conversation: its messages, its turns through the LLM, slash commands, context trimming.

No rendering here: the loop in command.py feeds lines in and hands what comes out to a view.
The whole conversation is re-sent every turn; the Engine (and the draft proposer) reuse the cached
token prefix, so only the new turn is prefilled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from speclite.engine.engine import Chunk, RequestOutput
from speclite.sampling import SamplingParams
from speclite.engine.stats import RequestStats
from speclite.errors import SpecliteError
from speclite.files import write_atomic

HELP = """\
/help          this list
/stats         session totals
/reset         start a new conversation (keeps the system prompt)
/k N|auto      drafts per iteration, or adapt them
/sp off|on     plain decoding / speculation
/system TEXT   set the system prompt (no TEXT: remove it)
/save FILE     write the conversation as JSON
/exit          quit (also Ctrl-D); Ctrl-C stops an answer"""


@dataclass
class Reply:
    """What a slash command has to say."""

    text: str = ""
    error: bool = False
    stats: RequestStats | None = None  # /stats: the session totals to show
    exit: bool = False


class Session:
    def __init__(self, llm, params: SamplingParams, system: str | None = None):
        self.llm, self.params, self.system = llm, params, system or None
        self.turns: list[dict] = []  # user and assistant messages, alternating
        self.totals = RequestStats(done_s=0.0)
        self.last: RequestOutput | None = None
        self.answers = 0  # over the whole session, /reset included

    @property
    def messages(self) -> list[dict]:
        return self._with_system(self.turns)

    def _with_system(self, turns: list[dict]) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + turns

    # -- turns ---------------------------------------------------------------------------------

    def ask(self, text: str) -> tuple[int, Iterator[Chunk]]:
        """(turns dropped to fit the context, the answer's chunks).

        Raises SpecliteError (nothing sent) when even this message alone does not fit. Closing
        the chunks early (Ctrl-C) keeps the partial answer in the history.
        """
        turns, dropped = self._fit([*self.turns, {"role": "user", "content": text}])
        self.turns = turns[:-1]
        return dropped, self._answer(turns)

    def _fit(self, turns: list[dict]) -> tuple[list[dict], int]:
        """Drop the oldest turns until the prompt leaves room for an answer."""
        max_len = self.llm.max_len
        # Room kept for the answer: all of it if it is short, else a quarter of the context.
        reserve = min(self.params.max_new_tokens, max_len // 4)
        dropped = 0
        while True:
            n = len(self.llm.encode(self._with_system(turns)))
            if n + reserve <= max_len or (len(turns) == 1 and n < max_len):
                return turns, dropped
            if len(turns) == 1:
                raise SpecliteError(
                    f"this message is {n} tokens with the chat template and system prompt: it does not fit "
                    f"the context of {max_len} tokens (nothing was sent)"
                )
            turns, dropped = turns[2:], dropped + 1

    def _answer(self, turns: list[dict]) -> Iterator[Chunk]:
        result: list[RequestOutput] = []
        stream = self.llm.stream(self._with_system(turns), self.params, result=result)
        try:
            yield from stream
        finally:
            stream.close()  # the Engine records what was generated so far into `result`
            if result:
                out = self.last = result[0]
                self.turns = turns + [{"role": "assistant", "content": out.text}]
                self.totals.merge(out.stats)
                self.answers += 1

    # -- slash commands ------------------------------------------------------------------------

    def command(self, line: str) -> Reply:
        """Run one slash command; bad input is an error Reply and the session goes on."""
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        handler = {
            "/help": self._help, "/stats": self._stats, "/reset": self._reset, "/k": self._k,
            "/sp": self._sp, "/system": self._system, "/save": self._save, "/exit": self._exit, "/quit": self._exit,
        }.get(name)
        if handler is None:
            return Reply(f"unknown command '{name}': /help lists them", error=True)
        try:
            return handler(arg)
        except SpecliteError as e:
            return Reply(str(e), error=True)

    def _help(self, arg: str) -> Reply:
        return Reply(HELP)

    def _stats(self, arg: str) -> Reply:
        if not self.answers:
            return Reply("no answers yet")
        return Reply(f"session totals: {self.answers} answer{'s' if self.answers > 1 else ''}", stats=self.totals)

    def _reset(self, arg: str) -> Reply:
        self.turns = []
        return Reply("new conversation" + (" (system prompt kept)" if self.system else ""))

    def _k(self, arg: str) -> Reply:
        if not self.llm.speculation_available:
            raise SpecliteError("no speculation method was loaded: start with --sp-type to set k")
        if self.llm.k_label is None:
            raise SpecliteError("speculation is off: /sp on first")
        if arg != "auto" and not (arg.isascii() and arg.isdigit()):  # not '²', which isdigit() takes
            raise SpecliteError(f"/k takes a number or 'auto', got '{arg}'")
        try:
            self.llm.set_k(arg if arg == "auto" else int(arg))
        except SpecliteError as e:  # in the chat's words: the value came from /k (the flag's, or the API's key)
            raise SpecliteError(re.sub("--gen-num-per-cycle|num_speculative_tokens", "/k", str(e))) from None
        return Reply(f"k set to {self.llm.k_label}")

    def _sp(self, arg: str) -> Reply:
        if arg not in ("on", "off"):
            raise SpecliteError(f"/sp takes 'on' or 'off', got '{arg}'")
        self.llm.set_speculation(arg == "on")
        return Reply("speculation " + ("on" if arg == "on" else "off: plain decoding"))

    def _system(self, arg: str) -> Reply:
        self.system = arg or None
        return Reply("system prompt set" if arg else "system prompt removed")

    def _save(self, arg: str) -> Reply:
        if not arg:
            raise SpecliteError("/save needs a file name")
        path = Path(arg).expanduser()
        record = {"model": self.llm.model_name, "draft": self.llm.draft_name,
                  "speculation": self.llm.spec_config.method, "messages": self.messages}
        try:
            write_atomic(path, (json.dumps(record, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
        except OSError as e:
            raise SpecliteError(f"cannot write {path}: {e.strerror or e}") from None
        return Reply(f"saved {len(self.messages)} messages to {path}")

    def _exit(self, arg: str) -> Reply:
        return Reply(exit=True)
