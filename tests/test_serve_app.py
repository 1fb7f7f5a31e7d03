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
