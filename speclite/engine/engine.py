"""The engine: one target (and maybe a proposer), its cache, and requests in -> text and stats out."""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from speclite.engine.detokenize import IncrementalDetokenizer
from speclite.engine.loop import Request, Speculation, decode
from speclite.sampling import SamplingParams
from speclite.engine.stats import RequestStats
from speclite.errors import ContextLengthError, SpecliteError
from speclite.model import Transformer
from speclite.model.kv_cache import shared_prefix
from speclite.request import check_sampling


@dataclass
class RequestOutput:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: RequestStats
    prompt_len: int = 0
    id: object = None

    @property
    def aux_info(self) -> dict:
        return self.stats.aux_info()


@dataclass
class Chunk:
    """What one iteration added: new tokens and the text they completed (may be empty)."""

    token_ids: list[int]
    text: str
    stats: RequestStats | None = None  # the request's figures so far (chat's live panel): one object, updated
    # as the request goes on (every chunk holds the same; copy it to keep the figures of a moment)


@dataclass
class Engine:
    target: Transformer
    tokenizer: object  # a transformers tokenizer
    eos_ids: set[int]
    max_len: int
    spec: Speculation | None = None
    _cache: object = field(default=None, repr=False)
    _cached_ids: list[int] = field(default_factory=list, repr=False)
    # One request at a time (one cache): a request holds the turn from its first step to its end, so
    # another thread's request waits for it. The turn is the holder's mark, set and cleared under the
    # condition, and cleared in the stream's finally only if it is that stream's: a Ctrl-C landing
    # anywhere leaves no turn held (a lock taken in one call and released in a later finally could be
    # left taken by one landing in between). The streams not ended yet, each by weak reference (a
    # stream its consumer dropped is collected, and its end ends its turn) with the thread that last
    # read it (or made it): a thread's new request ends its own stream left open.
    _turn: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _holder: object = field(default=None, repr=False)  # the mark of the stream whose turn it is
    # mark -> (weak reference, [its reader's thread], what ends it unread)
    _open: dict = field(default_factory=dict, repr=False)

    @property
    def cache(self):
        if self._cache is None:
            self._cache = self.target.new_cache(self.max_len)
        return self._cache

    def reset(self) -> None:
        """Forget the cached prefix (a new conversation), the proposer's included."""
        self._cached_ids = []
        if self._cache is not None:
            self._cache.rollback(0)
        if self.spec is not None:
            self.spec.proposer.reset()

    def stream(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        extra: dict | None = None,
        result: list | None = None,
        texts: bool = True,
    ) -> Iterator[Chunk]:
        """Generate for one prompt, yielding chunks as they are verified.

        The finished RequestOutput is appended to `result` (if given) when the stream ends, also
        when the consumer stops early (Ctrl-C in chat): what was generated so far is kept. With
        `texts` off the chunks carry no text and nothing is decoded before the end, unless a stop
        string must be looked for (decoding as it goes is a real share of a small model's step).

        A new request ends a stream that this thread made or last read and left open (read in part and
        kept): the two would share one cache; its result's finish_reason is "abort". Another thread's
        request waits until this one ends, or until the thread that last read it has ended (a stream
        kept by a thread that ended is never read again: it is ended then).
        """
        me = threading.current_thread()
        for ref, owner, unread in list(self._open.values()):
            left = ref()
            if left is not None and owner[0] is me and not left.gi_running:
                if inspect.getgeneratorstate(left) == inspect.GEN_CREATED:
                    unread()  # never read: its body, which would say so, never runs
                left.close()  # its finally: the cache's bookkeeping, its result, its turn
        check_sampling(params)  # a SamplingParams changed since it was made
        if not prompt_ids:
            raise SpecliteError("the prompt is empty")
        if len(prompt_ids) >= self.max_len:  # said now, not at the stream's first read
            raise ContextLengthError(
                f"prompt of {len(prompt_ids)} tokens does not fit the maximum context length of {self.max_len} tokens"
            )
        mark, owner = object(), [me]
        stream = self._stream(prompt_ids, params, extra, result, texts, mark, owner)

        def unread():
            if result is not None:
                result.append(RequestOutput("", [], "abort", RequestStats(), len(prompt_ids)))

        self._open[mark] = (weakref.ref(stream, lambda _: self._open.pop(mark, None)), owner, unread)
        return stream

    def _stream(self, prompt_ids, params, extra, result, texts, mark, owner) -> Iterator[Chunk]:
        try:
            owner[0] = threading.current_thread()
            self._take_turn(mark)
            for chunk in self._run(prompt_ids, params, extra, result, texts):
                yield chunk
                owner[0] = threading.current_thread()
        finally:
            with self._turn:
                if self._holder is mark:
                    self._holder = None
                    self._turn.notify()
            self._open.pop(mark, None)

    def _take_turn(self, mark) -> None:
        """Once the request whose turn it is ends; one held by a stream whose last reader's thread has
        ended is ended here (its finally, on this thread: the condition's lock is reentrant)."""
        with self._turn:
            while self._holder is not None:
                ref, owner, _ = self._open.get(self._holder, (lambda: None, None, None))
                left = ref()
                if left is not None and not owner[0].is_alive() and not left.gi_running:
                    left.close()
                else:
                    self._turn.wait(0.1)
            self._holder = mark

    def _run(self, prompt_ids, params, extra, result, texts) -> Iterator[Chunk]:
        cache = self.cache
        # Reuse the longest cached prefix (earlier chat turns, a shared system prompt).
        common = shared_prefix(self._cached_ids[: cache.length], prompt_ids)
        cache.rollback(min(common, cache.length))
        request = Request(prompt_ids, params, self.eos_ids, extra or {})
        run = decode(self.target, cache, request, self.spec)
        detok = IncrementalDetokenizer(self.tokenizer)
        emitted, stop_at, failed = 0, None, False
        follow = texts or bool(params.stop)
        try:
            with torch.inference_mode():
                for new in run:
                    if not follow:
                        detok.ids.extend(new)
                        yield Chunk(new, "", run.stats)
                        continue
                    mark = detok.mark()
                    text = detok.add(new)
                    stop_at = _find_stop(text, params.stop, emitted)
                    if stop_at is not None and len(new) > 1:
                        # Again token by token, as plain decoding meets them: the output ends with the
                        # token that completes the stop string, whatever the call verified after it.
                        detok.back_to(mark)
                        seen = emitted
                        for i, token in enumerate(new):
                            text = detok.add([token])
                            stop_at = _find_stop(text, params.stop, seen)
                            if stop_at is not None:
                                new = new[: i + 1]
                                run.cut(len(new))
                                break
                            seen = len(text)
                    if stop_at is not None:
                        run.finish_reason = "stop"
                        text = text[:stop_at]
                    # A tail that begins a stop string may yet become one: held back until it cannot.
                    sent = len(text) - (0 if stop_at is not None else _stop_prefix(text, params.stop))
                    sent = max(sent, emitted)
                    yield Chunk(new, text[emitted:sent], run.stats)
                    emitted = sent
                    if stop_at is not None:
                        break
                else:
                    # The end: what was held back goes out (a tail that could have begun a stop string, a
                    # character whose last bytes never came), so the streamed text is the answer's.
                    tail = detok.final()[emitted:] if follow else ""
                    if tail:
                        yield Chunk([], tail, run.stats)
        except GeneratorExit:  # the consumer stopped reading (or a later request ended it) between chunks
            raise
        except BaseException:  # in the middle of a step (Ctrl-C, out of memory): the cache and the
            failed = True      # proposer's state may be half updated
            raise
        finally:
            if not (run.last or stop_at is not None):  # (the decoding's end: its last chunk was last)
                run.finish_reason = "abort"
            run.close()
            run.stats.finish()
            out_ids = detok.ids
            self._cached_ids = (prompt_ids + out_ids)[: cache.length]
            if failed:
                self.reset()
            if result is not None:
                text = detok.text[:stop_at] if stop_at is not None else detok.final()
                result.append(RequestOutput(text, out_ids, run.finish_reason, run.stats, len(prompt_ids)))

    def generate(self, prompt_ids: list[int], params: SamplingParams, extra: dict | None = None) -> RequestOutput:
        result: list[RequestOutput] = []
        for _ in self.stream(prompt_ids, params, extra, result, texts=False):
            pass
        return result[0]


def _stop_prefix(text: str, stops: list[str]) -> int:
    """The length of the longest tail of text that is the start of a stop string (not a whole one)."""
    return max((n for stop in stops for n in range(min(len(stop) - 1, len(text)), 0, -1)
                if text.endswith(stop[:n])), default=0)


def _find_stop(text: str, stops: list[str], emitted: int) -> int | None:
    """Index of the earliest stop string in text that ends past what was already emitted."""
    best = None
    for stop in stops:
        i = text.find(stop, max(0, emitted - len(stop) + 1))
        if i != -1 and (best is None or i < best):
            best = i
    return best
