"""The serve app in-process (Starlette's TestClient): prefix reuse across requests, and speculative edit
through the API's extra_body fields, on the bundled tiny-code model with prompt lookup."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from fastapi.testclient import TestClient  # noqa: E402

from speclite import LLM, SamplingParams, SpecConfig  # noqa: E402
from speclite.serve.app import create_app  # noqa: E402
from target_steps import StepSizes  # noqa: E402

PROMPT = "import os\n\n\ndef read_lines(path):\n"


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny-code", SpecConfig("deterministic", k=4))


@pytest.fixture(scope="module")
def http(llm):
    with TestClient(create_app(llm, "coder", defaults=SamplingParams(max_new_tokens=24))) as client:
        yield client


def test_a_chat_turn_prefills_only_what_is_new(llm, http):
    """The second turn re-sends the first: only the new messages go through a prefill forward."""
    steps = StepSizes(llm.target)
    try:
        turn1 = [{"role": "user", "content": "def add(a, b):"}]
        r1 = http.post("/v1/chat/completions", json={"messages": turn1}).json()
        turn2 = turn1 + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "class Stack:"}]
        steps.sizes.clear()
        r2 = http.post("/v1/chat/completions", json={"messages": turn2}).json()
    finally:
        steps.remove()
    new_tokens = r2["usage"]["prompt_tokens"] - r1["usage"]["prompt_tokens"]
    assert 0 < steps.sizes[0] <= new_tokens < r2["usage"]["prompt_tokens"] - 1


def test_speculative_edit_through_extra_body(http):
    """sp_advice_prompt + sp_edit reach prompt lookup: the same greedy text, in fewer iterations."""
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
    plain = client.completions.create(model="coder", prompt=PROMPT, max_tokens=24)
    text = plain.choices[0].text
    edit = client.completions.create(model="coder", prompt=PROMPT, max_tokens=24,
                                     extra_body={"sp_advice_prompt": text, "sp_edit": 1})
    assert edit.choices[0].text == text
    spec, base = edit.usage.model_extra["speculative"], plain.usage.model_extra["speculative"]
    assert spec["iter_count"] < base["iter_count"] and spec["avg_tokens_per_iter"] >= 2.5


def serve_app(monkeypatch, *flags):
    """The app `speclite serve` builds with these flags (its server replaced: nothing listens)."""
    from click.testing import CliRunner

    import speclite.serve.command
    from speclite.cli import cli

    apps = []
    monkeypatch.setattr(speclite.serve.command, "run_server", lambda app, config: apps.append(app) or [])
    r = CliRunner().invoke(cli, ["serve", "--model", "tiny-code", *flags], obj={})
    assert r.exit_code == 0, r.output
    return TestClient(apps[0])


def test_serve_defaults_are_openai_unless_flags_give_them(monkeypatch):
    """A request without temperature samples at 1 and without max_tokens runs to the context's end
    (OpenAI's defaults); --temperature and --max-new-tokens replace them."""
    with serve_app(monkeypatch, "--max-model-len", "96") as http:
        def text(**fields):
            body = http.post("/v1/completions", json={"prompt": PROMPT, **fields}).json()
            return body["choices"][0]["text"], body["choices"][0]["finish_reason"], body["usage"]["total_tokens"]

        seeded = [text(seed=s) for s in (1, 2)]
        assert seeded[0] == text(seed=1, temperature=1.0, max_tokens=96)  # the same draws: temperature 1
        assert seeded[0][0] != seeded[1][0]
        for _, finish, total in seeded:  # no cut at a default of its own (the last token needs no cache slot)
            assert finish == "stop" or total == 97
    with serve_app(monkeypatch, "--temperature", "0", "--max-new-tokens", "5") as http:
        bodies = [http.post("/v1/completions", json={"prompt": PROMPT, "seed": s}).json() for s in (1, 2)]
        assert bodies[0]["choices"][0]["text"] == bodies[1]["choices"][0]["text"]  # greedy
        assert bodies[0]["usage"]["completion_tokens"] == 5
