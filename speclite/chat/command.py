"""`speclite chat`: flags -> LLM -> a Session driven line by line, shown by a live or a plain view."""

from __future__ import annotations

import signal
import sys

import click

from speclite.cli_options import build_llm, model_options, sampling_options, sampling_params, spec_options
from speclite.errors import SpecliteError


@click.command()
@model_options
@spec_options
@sampling_options
@click.option("--system", default=None, help="System prompt.")
@click.pass_context
def chat(ctx, system, max_new_tokens, temperature, top_p, top_k, seed, **flags):
    """Chat with a model and watch speculation work: /help lists the commands."""
    from speclite.chat.session import Session
    from speclite.chat.view import LiveView, PlainView

    params = sampling_params(max_new_tokens, temperature, top_p, top_k, seed)
    llm = build_llm(ctx, **flags)
    if not llm.tokenizer.chat_template:
        raise SpecliteError(f"model '{llm.model_name}' has no chat template: chat needs an instruct model "
                            "(speclite generate takes plain prompts)")
    view = LiveView() if sys.stdout.isatty() else PlainView()
    view.info(f"loaded: {llm.describe()}")
    view.info(memory_line(llm))
    view.info("/help for commands, Ctrl-C stops an answer, Ctrl-D or /exit quits")
    run(Session(llm, params, system), view, interactive=sys.stdin.isatty())


def run(session, view, interactive: bool) -> None:
    """Read lines until /exit or end of input; each is a slash command or a message to answer."""
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
    # Bytes that are not UTF-8 arrive as lone surrogates, refused below line by line; a strict decoder
    # (some locales, PYTHONIOENCODING) would raise and drop the rest of its buffered input with them.
    getattr(sys.stdin, "reconfigure", lambda **kw: None)(errors="surrogateescape")
    while True:
        try:
            line = input("> " if interactive else "").strip()
            line.encode("utf-8")
            if not interactive and line:
                view.reply(f"> {line}")  # piped prompts: keep the transcript readable
            if line.startswith("/"):
                if not command(session, view, line):
                    return
            elif line:
                answer(session, view, line)
        except UnicodeError:
            view.error("that line is not UTF-8 text: ignored")
        except EOFError:
            if interactive:
                view.reply("")  # Ctrl-D leaves the cursor after the prompt
            return
        except KeyboardInterrupt:  # at the prompt, or while a command's output was printing
            view.info("\n(Ctrl-D or /exit to quit)")


def command(session, view, line: str) -> bool:
    """Run a slash command and show its reply; False when it ends the chat."""
    from speclite.chat.view import Setup

    reply = session.command(line)
    if reply.error:
        view.error(reply.text)
    elif reply.stats is not None:
        view.totals(reply.stats, Setup.of(session.llm), reply.text)
    elif reply.text:
        view.reply(reply.text)
    return not reply.exit


def answer(session, view, line: str) -> None:
    """Stream one answer; Ctrl-C stops it and keeps what was generated."""
    from speclite.chat.view import Setup

    try:
        dropped, chunks = session.ask(line)
    except SpecliteError as e:
        view.error(str(e))
        return
    if dropped:
        view.info(f"context of {session.llm.max_len} tokens is full: dropped the oldest {dropped} turn(s)")
    before = session.last
    ctrl_c = CtrlC()
    previous = signal.signal(signal.SIGINT, ctrl_c)
    try:
        view.start(Setup.of(session.llm))
        for chunk in chunks:
            view.update(chunk)
            if ctrl_c.pressed:
                break
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: stop at once
    except SpecliteError as e:
        view.error(str(e))
    finally:
        signal.signal(signal.SIGINT, previous)
        chunks.close()  # runs the Session's and the Engine's bookkeeping for a partial answer
        view.end(session.last if session.last is not before else None, ctrl_c.pressed)


class CtrlC:
    """SIGINT while an answer streams: the first stops it after the current iteration, so the caches
    and the live display are never left half-updated; a second one interrupts at once."""

    def __init__(self):
        self.pressed = False

    def __call__(self, signum, frame):
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True


def memory_line(llm) -> str:
    """Weights and KV cache bytes of the target and (if any) the proposer's own models."""
    m = llm.memory()
    weights = f"weights {_mb(m['weights'])}" + (f" + draft {_mb(m['draft_weights'])}" if m["draft_weights"] else "")
    kv = f"KV cache {_mb(m['kv'])}" + (f" + draft {_mb(m['draft_kv'])}" if m["draft_kv"] else "")
    return f"memory: {weights}, {kv} ({llm.max_len} tokens of context)"


def _mb(n: int) -> str:
    if n < 2**20:
        return f"{n / 2**10:.0f} KiB"
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"
