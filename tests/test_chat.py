"""The chat session in-process: prefix reuse across turns, interrupts, context trimming, slash commands, panel."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from target_steps import StepSizes

from speclite.api import LLM, SpecConfig
from speclite.chat.command import run
from speclite.chat.session import Session
from speclite.chat.view import Setup, stats_line, stats_panel
from speclite.sampling import SamplingParams
from speclite.engine.stats import RequestStats
from speclite.errors import SpecliteError


@pytest.fixture(scope="module")
def llm(pair):
    target, draft = pair
    return LLM(target, SpecConfig(method="vanilla", k=4, draft=draft))


@pytest.fixture
def session(llm):
    llm.set_speculation(True)
    llm.set_k(4)
    return Session(llm, SamplingParams(max_new_tokens=12), system="be brief")


def answer(session, text):
    dropped, chunks = session.ask(text)
    return dropped, list(chunks)


def forward_sizes(model):
    """Tokens in each forward call of `model`, recorded by a hook (the caller removes it)."""
    sizes = []
    handle = model.register_forward_pre_hook(lambda module, args: sizes.append(args[0].shape[0]))
    return sizes, handle


def test_second_turn_prefills_only_the_new_tokens(session, llm):
    llm.engine.reset()
    answer(session, "hello there")
    first_prompt = llm.encode(session.messages[:-1])
    second_prompt = llm.encode(session.messages + [{"role": "user", "content": "and now?"}])
    new_tokens = len(second_prompt) - len(first_prompt)  # the first answer and the new user turn
    h1 = StepSizes(llm.target)
    target_sizes = h1.sizes
    draft_sizes, h2 = forward_sizes(llm.engine.spec.proposer.model)
    try:
        answer(session, "and now?")
    finally:
        h1.remove()
        h2.remove()
    # Without reuse the prefill would be the whole conversation (len(second_prompt) - 1 tokens).
    assert 0 < target_sizes[0] <= new_tokens < len(second_prompt) - 1
    # The draft's first call feeds its pending tokens: the new ones, plus at most the one it lags by.
    assert 0 < draft_sizes[0] <= new_tokens + 1


def test_interrupted_answer_stays_in_the_history(session):
    _, chunks = session.ask("count to ten")
    got = [next(chunks), next(chunks)]
    chunks.close()  # what Ctrl-C does
    out = session.last
    assert out.token_ids == [t for c in got for t in c.token_ids]
    assert session.turns[-1] == {"role": "assistant", "content": out.text}
    assert session.totals.output_len == len(out.token_ids)
    _, more = answer(session, "go on")
    assert more and session.turns[-2]["content"] == "go on"


def test_context_overflow_drops_oldest_turns_and_keeps_system(pair):
    target, _ = pair
    small = LLM(target, max_model_len=96)
    session = Session(small, SamplingParams(max_new_tokens=16), system="sys")
    dropped_total = 0
    for i in range(6):
        dropped, _ = answer(session, f"message number {i} " * 3)
        dropped_total += dropped
        assert len(small.encode(session.messages[:-1])) < small.max_len
    assert dropped_total > 0
    assert session.messages[0] == {"role": "system", "content": "sys"}
    assert session.turns[-2]["content"].startswith("message number 5")
    before = list(session.turns)
    with pytest.raises(SpecliteError, match="does not fit the context of 96 tokens"):
        session.ask("word " * 200)
    assert session.turns == before


def test_slash_commands(session, llm, tmp_path):
    assert session.command("/k 3").text == "k set to 3" and llm.engine.spec.length.label == "3"
    assert session.command("/k auto").text.startswith("k set to auto(")
    for bad in ("/k", "/k x", "/k 99", "/k \u00b2", "/sp maybe", "/nope", "/save", f"/save {tmp_path}/missing/dir/c.json"):
        reply = session.command(bad)
        assert reply.error and reply.text and "\n" not in reply.text, bad
    assert "/k must be between 0 and 64, got 99" in session.command("/k 99").text  # the flag's name is not the chat's
    assert session.command("/stats").text == "no answers yet"
    answer(session, "hi")
    reply = session.command("/stats")
    assert reply.text == "session totals: 1 answer" and reply.stats.output_len == session.last.stats.output_len
    assert session.command("/sp off").text.startswith("speculation off") and llm.engine.spec is None
    assert session.command("/k 2").error  # k means nothing while speculation is off
    assert session.command("/sp on").text == "speculation on" and llm.engine.spec is not None
    assert session.command("/system talk like a pirate").text == "system prompt set"
    assert session.command(f"/save {tmp_path}/c.json").text.startswith("saved 3 messages")
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved["messages"][0] == {"role": "system", "content": "talk like a pirate"}
    assert saved["messages"][1] == {"role": "user", "content": "hi"}
    assert session.command("/reset").text.startswith("new conversation") and session.turns == []
    assert "/k N|auto" in session.command("/help").text
    assert session.command("/exit").exit


def test_a_failed_save_keeps_the_earlier_file(session, tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    assert not session.command(f"/save {path}").error
    before = path.read_bytes()
    session.system = "changed"

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("speclite.files.os.replace", refuse)
    reply = session.command(f"/save {path}")
    assert reply.error and "No space left on device" in reply.text
    assert path.read_bytes() == before and list(tmp_path.iterdir()) == [path]  # no staged file left


class Recorded:
    """A view that keeps what it was given, by method."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def test_a_line_that_is_not_utf8_is_refused_and_the_chat_goes_on(session, monkeypatch):
    # Piped or typed bytes that are not UTF-8 reach input() as lone surrogates (or raise, by locale).
    lines = iter(["/system caf\udce9", UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "/help"])

    def fake_input(prompt=""):
        line = next(lines, None)
        if line is None:
            raise EOFError
        if isinstance(line, Exception):
            raise line
        return line

    monkeypatch.setattr("builtins.input", fake_input)
    view = Recorded()
    run(session, view, interactive=False)
    assert [c for c in view.calls if c[0] == "error"] == [("error", "that line is not UTF-8 text: ignored")] * 2
    assert session.system == "be brief" and any(c[0] == "reply" and "/k N|auto" in c[1] for c in view.calls)


def test_bytes_that_are_not_utf8_lose_no_later_line(pair):
    """With a strict stdin decoder (PYTHONIOENCODING=utf-8) the bad line is refused and the lines after
    it still run (a decoder error would have dropped its whole buffered chunk)."""
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "speclite.launch", "chat", "-m", str(pair[0]), "--max-new-tokens", "2"],
                         input=b"hi \xff\n/stats\n/help\n", capture_output=True, timeout=120,
                         env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    out, err = run.stdout.decode(), run.stderr.decode()
    assert run.returncode == 0 and "that line is not UTF-8 text: ignored" in out + err
    assert "no answers yet" in out and "/k N|auto" in out, (out, err)


def test_a_checkpoints_own_quantization_is_shown(pair, tmp_path):
    """A target and a draft quantized on disk (their quantization_config) read as such, as those quantized
    at load do, in the loaded line and the panel."""
    from speclite.quant import quantize_to_dir

    quantize_to_dir(pair[0], tmp_path / "t", "int4", group_size=32, evaluate=False)
    quantize_to_dir(pair[1], tmp_path / "d", "fp8-block", evaluate=False)
    llm = LLM(tmp_path / "t", SpecConfig(method="vanilla", k=2, draft=str(tmp_path / "d")))
    assert "target " + str(tmp_path / "t") + " [int4 gptq], draft " + str(tmp_path / "d") + " [fp8]" in llm.describe()
    assert Setup.of(llm).models == "target t [int4 gptq] · draft d [fp8]"
    loaded = LLM(pair[0], SpecConfig(method="vanilla", k=2, draft=str(pair[1]), draft_quant="w8a8"), quant="int4")
    assert Setup.of(loaded).models.endswith("[int4] · draft draft [w8a8]")


def test_k_needs_a_speculation_method(pair):
    session = Session(LLM(pair[0]), SamplingParams(max_new_tokens=4))
    reply = session.command("/k 3")
    assert reply.error and "--sp-type" in reply.text


def test_panel_fits_80_columns_and_shows_the_figures(session, llm):
    stats = RequestStats(done_s=0.5)
    for accepted in (4, 2, 0, 3):
        stats.record(4, accepted, accepted + 1)
    stats.record(12, 12, 13)  # more positions than the panel draws as bars
    stats.draft_s, stats.verify_s = 0.2, 0.1
    console = Console(width=80, record=True)
    console.print(stats_panel(stats, Setup.of(llm)))
    lines = console.export_text().splitlines()
    text = "\n".join(lines)
    assert all(len(line) <= 80 for line in lines)
    figures = ("vanilla k=4", "accept rate  75.0%", "tokens/iter         5.20", "200/100 ms", "positions 9-12")
    for figure in figures:
        assert figure in text, figure
    assert "accept rate 75.0%" in stats_line(stats, Setup.of(llm))
