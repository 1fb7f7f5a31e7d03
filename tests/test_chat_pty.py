"""`speclite chat` driven as a user would: in a pseudo-terminal (live panel) and with piped input."""

from __future__ import annotations

import os
import subprocess
import sys

import pexpect
import pytest

from conftest import save_model, save_noisy_copy

# One torch thread: the test machines have 2 shared cores, and thread contention there makes a tiny
# model ~20x slower.
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TERM="xterm", COLUMNS="80", LINES="24", OMP_NUM_THREADS="1")
TIMEOUT = 90  # starting Python, torch and the models on a busy machine takes a while


def spawn(*args: str) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, ["-m", "speclite.cli", "chat", *args], env=ENV, encoding="utf-8",
                          timeout=TIMEOUT, dimensions=(24, 80))
    child.expect("loaded: ")
    child.expect("memory: weights .* KV cache")
    child.expect("> ")
    return child


def finish(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


@pytest.fixture(scope="module")
def long_pair(tmp_path_factory, tokenizer):
    """The pair's target with a 16k context, so an answer runs long enough to be interrupted."""
    root = tmp_path_factory.mktemp("long")
    save_model(root / "target", "qwen2", tokenizer=tokenizer, seed=1, hidden=96, layers=3,
               tie_word_embeddings=False, max_position_embeddings=16384)
    save_noisy_copy(root / "target", root / "draft", noise=0.1, seed=2, vocab_pad=16)
    return root / "target", root / "draft"


def test_chat_in_a_terminal(pair):
    target, draft = pair
    child = spawn("--model", str(target), "--sp-type", "vanilla", "--draft", str(draft), "--max-new-tokens", "24")
    child.sendline("hello there")
    for figure in ("vanilla k=4", "tokens/s", "accept rate", "accepted by draft position", " 1 [█░]+ +\\d+%"):
        child.expect(figure)
    child.expect("> ")
    child.sendline("/k 3")
    child.expect("k set to 3")
    child.sendline("and again")
    child.expect("vanilla k=3")
    child.expect("> ")
    child.sendline("/k lots")
    child.expect("error: /k takes a number or 'auto', got 'lots'")
    child.sendline("/reset")
    child.expect("new conversation")
    child.sendline("/stats")
    child.expect("session totals: 2 answers")
    child.sendline("/exit")
    assert finish(child) == 0


def test_ctrl_c_stops_an_answer_and_the_next_prompt_works(long_pair):
    target, draft = long_pair
    child = spawn("--model", str(target), "--sp-type", "vanilla", "--draft", str(draft),
                  "--max-model-len", "16384", "--max-new-tokens", "16000")
    for prompt in ("tell me a long story", "go on"):
        child.sendline(prompt)
        child.expect(r"accept rate +\d")  # the live panel has figures: the answer is streaming
        child.sendintr()
        child.expect("interrupted: the partial answer stays in the conversation")
        child.expect("accepted by draft position")
        child.expect("> ")
    child.sendline("/stats")
    child.expect("session totals: 2 answers")
    child.expect("> ")
    child.sendintr()  # at the prompt Ctrl-C only says how to quit
    child.expect(r"\(Ctrl-D or /exit to quit\)")
    child.sendeof()
    assert finish(child) == 0


def test_piped_prompts_are_answered_one_per_line(pair):
    target, _ = pair
    run = subprocess.run([sys.executable, "-m", "speclite.cli", "chat", "--model", str(target),
                          "--max-new-tokens", "8"], input="hi\nbye\n", env=ENV, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "> hi\n" in out and "> bye\n" in out
    assert out.count("[plain decoding (speculation off)] 8 tokens") == 2
    assert "\x1b[" not in out  # plain lines, no terminal control codes
    assert run.stderr.startswith("loaded: target")
