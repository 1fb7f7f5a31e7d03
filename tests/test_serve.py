"""`speclite serve` end to end: a real server process on 127.0.0.1, driven by the official openai client.

One server per module (the bundled tiny-code pair, vanilla speculation) and one `speclite generate` run
for the greedy references, started side by side.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
FLAGS = ["--model", "tiny-code", "--sp-type", "vanilla"]
MAX_TOKENS = 20
CODE = ["def fibonacci(n):\n", "import os\n\n\ndef read_lines(path):\n", "class Stack:\n    def __init__(self):\n",
        "for i in range(10):\n", "def add(a, b):\n", "import json\n", "def parse(text):\n", "x = [1, 2, 3]\n",
        "while True:\n", "def main():\n", "class Node:\n", "def sort(items):\n", "if __name__ == '__main__':\n",
        "def load(path):\n", "try:\n", "def mean(xs):\n"]
# One thread each: the tiny model is launch-bound, and two spinning OpenMP threads per process on a shared
# 2-core machine make every process many times slower.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
MESSAGES = [[{"role": "user", "content": "def add(a, b):"}],
            [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "class Stack:"}]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Greedy outputs of `speclite generate` with the same model and flags, keyed by id."""
    d = tmp_path_factory.mktemp("refs")
    lines = [{"id": f"p{i}", "prompt": p} for i, p in enumerate(CODE)]
    lines += [{"id": f"m{i}", "messages": m} for i, m in enumerate(MESSAGES)]
    (d / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = subprocess.Popen([sys.executable, "-m", "speclite.cli", "generate", *FLAGS, "--max-new-tokens",
                             str(MAX_TOKENS), "-i", str(d / "in.jsonl"), "-o", str(d / "out.jsonl")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    yield lambda: _finish_references(proc, d / "out.jsonl")
    proc.kill()


def _finish_references(proc, out) -> dict:
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return {r["id"]: r["text"] for r in map(json.loads, out.read_text().splitlines())}


def wait_until_up(proc, url: str) -> None:
    deadline = time.monotonic() + 240  # model load on a loaded shared machine
    while True:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def server(references):
    """Base URL of a server on a free port; always terminated."""
    port = free_port()
    # --temperature 0: requests that send none decode greedily, as the references (OpenAI's default is 1).
    proc = subprocess.Popen([sys.executable, "-m", "speclite.cli", "serve", *FLAGS, "--port", str(port),
                             "--api-key", KEY, "--max-queue", "8", "--served-model-name", "coder",
                             "--temperature", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(proc, url)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def refs(references):
    return references()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=60)


def metric(server: str, name: str) -> float:
    text = httpx.get(f"{server}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")
               or line.startswith(name + "{"))


SPECULATIVE_KEYS = {"avg_tokens_per_iter", "accept_rate", "accepted_per_position", "draft_time_ms",
                    "verify_time_ms", "iter_count", "output_len", "tokens_per_s", "cost_time_ms"}


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["coder"]
    assert client.models.retrieve("coder").id == "coder"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found"
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


def test_chat_equals_generate_with_speculative_usage(client, refs):
    for i, messages in enumerate(MESSAGES):
        r = client.chat.completions.create(model="coder", messages=messages, max_tokens=MAX_TOKENS)
        assert r.choices[0].message.content == refs[f"m{i}"]
        assert r.choices[0].message.role == "assistant"
        spec = r.usage.model_extra["speculative"]
        assert SPECULATIVE_KEYS <= set(spec)
        assert spec["output_len"] == r.usage.completion_tokens
        assert len(spec["accepted_per_position"]) == 4  # vanilla k=4
        assert 1.0 <= spec["avg_tokens_per_iter"] <= 5.0


def test_completions_equal_generate_streamed_and_not(client, refs):
    for i in (0, 1):
        r = client.completions.create(model="coder", prompt=CODE[i], max_tokens=MAX_TOKENS, temperature=0)
        assert r.choices[0].text == refs[f"p{i}"]
        assert r.choices[0].finish_reason in ("stop", "length")
        assert SPECULATIVE_KEYS <= set(r.usage.model_extra["speculative"])
        chunks = list(client.completions.create(model="coder", prompt=CODE[i], max_tokens=MAX_TOKENS, stream=True,
                                                stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == refs[f"p{i}"]
        assert chunks[-1].usage.model_extra["speculative"]["output_len"] == chunks[-1].usage.completion_tokens


def test_chat_stream_format(server, refs):
    """Role first, content deltas, a finish chunk, the usage chunk, then [DONE]."""
    body = {"model": "coder", "messages": MESSAGES[0], "max_tokens": MAX_TOKENS, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"  # a proxy passes the events on as they come
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    deltas = chunks[1:-2]
    assert deltas and all(c["choices"][0]["finish_reason"] is None for c in deltas)
    assert "".join(c["choices"][0]["delta"]["content"] for c in deltas) == refs["m0"]
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and SPECULATIVE_KEYS <= set(chunks[-1]["usage"]["speculative"])


def test_chat_stream_with_openai_client_and_no_usage_by_default(client, refs):
    chunks = list(client.chat.completions.create(model="coder", messages=MESSAGES[1], max_tokens=MAX_TOKENS,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == refs["m1"]
    assert all(c.usage is None for c in chunks)


def test_stop_and_seeded_sampling(client, refs):
    text = refs["p0"]
    stop = text[5:8]
    r = client.completions.create(model="coder", prompt=CODE[0], max_tokens=MAX_TOKENS, stop=[stop])
    assert r.choices[0].text == text[: text.index(stop)] and r.choices[0].finish_reason == "stop"
    sampled = [client.completions.create(model="coder", prompt=CODE[0], max_tokens=MAX_TOKENS, temperature=1.0,
                                         top_p=0.9, seed=s, extra_body={"top_k": 50}).choices[0].text
               for s in (1, 1, 2)]
    assert sampled[0] == sampled[1] != sampled[2]


def test_sixteen_concurrent_streams_complete_or_get_429(server, refs):
    """Every request completes with its own greedy answer or is refused cleanly; the server stays healthy."""
    results: dict[int, object] = {}
    start = threading.Barrier(len(CODE))

    def run(i):
        client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)
        start.wait()
        try:
            stream = client.completions.create(model="coder", prompt=CODE[i], max_tokens=MAX_TOKENS, stream=True)
            results[i] = "".join(c.choices[0].text for c in stream if c.choices)
        except openai.RateLimitError as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(CODE))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    assert len(results) == len(CODE)
    done = [i for i, r in results.items() if isinstance(r, str)]
    for i, r in results.items():
        if isinstance(r, str):
            assert r == refs[f"p{i}"], i
        else:
            assert r.status_code == 429 and r.response.headers["retry-after"] == "1"
            assert r.body["type"] == "rate_limit_error"
    assert done
    health = httpx.get(f"{server}/health").json()
    assert health == {"status": "ok", "waiting": 0, "running": 0}


def test_full_queue_answers_429_and_departed_clients_free_it(server):
    """One running + 8 waiting fill the queue: the next request gets 429. When those clients leave, the
    waiting ones are dropped and the running one stops, so the engine is free again."""

    async def scenario():
        async with httpx.AsyncClient(base_url=server, headers=AUTH, timeout=60) as http:
            long = {"model": "coder", "prompt": CODE[0], "max_tokens": 1500, "stream": True}
            started = asyncio.get_running_loop().create_future()
            holders = [asyncio.create_task(_hold_stream(http, long, started))]
            await asyncio.wait_for(started, 60)  # the engine is busy with it
            holders += [asyncio.create_task(_hold_stream(http, long)) for _ in range(8)]
            await _until(lambda: httpx.get(f"{server}/health").json()["waiting"] == 8)
            r = await http.post("/v1/completions", json={"model": "coder", "prompt": "x", "max_tokens": 4})
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
            for h in holders:
                h.cancel()
            await asyncio.gather(*holders, return_exceptions=True)

    def outcome(name):
        return metric(server, f'speclite_requests_total{{outcome="{name}"}}')

    before = outcome("cancelled"), outcome("rejected")
    asyncio.run(scenario())
    asyncio.run(_until(lambda: httpx.get(f"{server}/health").json() == {"status": "ok", "waiting": 0,
                                                                        "running": 0}))
    assert (outcome("cancelled"), outcome("rejected")) == (before[0] + 9, before[1] + 1)


def test_client_killed_mid_stream_frees_the_engine(server, refs):
    """A streaming client that dies stops its generation after the current iteration."""
    before = metric(server, "speclite_generation_tokens_total")
    code = ("import httpx, sys\n"
            "body = {'model': 'coder', 'prompt': 'def f(x):', 'max_tokens': 1800, 'stream': True}\n"
            f"with httpx.stream('POST', '{server}/v1/completions', json=body, headers={AUTH!r}) as r:\n"
            "    for line in r.iter_lines():\n"
            "        if line.startswith('data: {'):\n"
            "            print('streaming', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "streaming"
    finally:
        proc.kill()
        proc.wait()
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=60)
    r = client.completions.create(model="coder", prompt=CODE[1], max_tokens=MAX_TOKENS)
    assert r.choices[0].text == refs["p1"]
    # The killed request generated far fewer than its 1800 tokens.
    assert metric(server, "speclite_generation_tokens_total") - before - r.usage.completion_tokens < 900


BAD_REQUESTS = [
    ("chat", b"{not json", 400, None),
    ("chat", b"[1, 2]", 400, None),
    ("chat", b"[" * 100000, 400, None),  # nested past Python's stack: a 400, not a 500
    ("chat", {"messages": "hi"}, 400, "messages"),
    ("chat", {"messages": [{"role": "user"}]}, 400, "messages"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages"),
    ("completions", {"prompt": 5}, 400, "prompt"),
    ("completions", {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("completions", {"prompt": "x", "max_tokens": "10"}, 400, "max_tokens"),
    ("completions", {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("completions", {"prompt": "x", "stop": 5}, 400, "stop"),
    ("completions", {"prompt": "x", "stop": [""]}, 400, "stop"),
    ("completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
    ("completions", {"prompt": "x", "n": 2}, 400, "n"),
    ("completions", {"prompt": "x", "logprobs": 3}, 400, "logprobs"),
    ("completions", {"prompt": "x", "logprobs": 0}, 400, "logprobs"),  # 0 asks for the chosen tokens' ones
    ("completions", {"prompt": ["x", "y"]}, 400, "prompt"),
    ("completions", {"prompt": [1, 2, 3]}, 400, "prompt"),
    ("completions", {"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ("completions", {"prompt": "x", "frequency_penalty": -1}, 400, "frequency_penalty"),
    ("completions", {"prompt": "x", "logit_bias": {"1": 5}}, 400, "logit_bias"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}, 400,
     "response_format"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}, 400, "tool_choice"),
    ("chat", {"messages": [{"role": "bogus", "content": "x"}]}, 400, "messages"),
    ("completions", {"prompt": "x", "sp_edit": "on"}, 400, "sp_edit"),
    ("completions", {"prompt": "x", "seed": 1.5}, 400, "seed"),
    ("completions", {"prompt": "x", "seed": 2**64}, 400, "seed"),
    ("completions", {"prompt": "x", "seed": -1}, 400, "seed"),
    ("completions", {"prompt": "x", "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("chat", {"messages": []}, 400, "messages"),
    ("completions", {"prompt": "x", "stop_token_ids": [True]}, 400, "stop_token_ids"),
    ("completions", {"prompt": ""}, 400, "prompt"),
    ("completions", b'{"prompt": "x", "sp_advice_prompt": "\\ud800"}', 400, "sp_advice_prompt"),
    ("completions", b'{"prompt": "x", "temperature": NaN}', 400, None),
    ("completions", {"prompt": "def f(x):\n" * 600, "max_tokens": 4}, 400, None),  # longer than the context
    ("completions", {"prompt": "def f(x):\n" * 600, "max_tokens": 4, "stream": True}, 400, None),
    ("completions", {"prompt": "x", "model": "gpt-4"}, 404, "model"),
]
# What clients send on every request meaning "not asked" (LangChain: the penalties at 0, no logit_bias).
NOT_ASKED = {"presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "logprobs": False,
             "response_format": {"type": "text"}, "tool_choice": "none", "user": "someone"}


@pytest.mark.parametrize("route,body,status,param", BAD_REQUESTS)
def test_bad_request_is_an_openai_error(server, route, body, status, param):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(f"{server}/v1/{route.replace('chat', 'chat/completions')}", headers=AUTH, timeout=60, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["param"] == param
    assert "\n" not in error["message"]
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


@pytest.mark.parametrize("chat, body, message", [
    (False, {"prompt": "x", "max_tokens": 0}, "max_tokens must be an integer >= 1"),
    (False, {"prompt": "x", "max_completion_tokens": -3}, "max_completion_tokens must be an integer >= 1"),
    (True, {"messages": []}, "'messages' is empty"),
])
def test_a_bad_field_is_named_as_the_client_sent_it(chat, body, message):
    """The validator's max_new_tokens, and an empty prompt's 'prompt' string on the chat route, were not
    the client's words."""
    from speclite import SamplingParams
    from speclite.serve.protocol import ApiError, to_request

    with pytest.raises(ApiError) as e:
        to_request(body, chat, SamplingParams())
    assert str(e.value).startswith(message), str(e.value)


def test_fields_at_their_not_asked_values_are_accepted(client, refs):
    r = client.chat.completions.create(model="coder", messages=MESSAGES[0], max_tokens=MAX_TOKENS, extra_body=NOT_ASKED)
    assert r.choices[0].message.content == refs["m0"]
    r = client.completions.create(model="coder", prompt=[CODE[0]], max_tokens=MAX_TOKENS)  # a list of one
    assert r.choices[0].text == refs["p0"]


def test_context_error_names_the_sizes_and_openai_code(server):
    r = httpx.post(f"{server}/v1/completions", headers=AUTH, json={"prompt": "def f(x):\n" * 600})
    error = r.json()["error"]
    assert "maximum context length of 2048 tokens" in error["message"]
    assert error["code"] == "context_length_exceeded"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                                     {"Authorization": f"Basic {KEY}"}])
def test_api_key_required_on_v1(server, headers):
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions")):
        r = httpx.request(method, f"{server}{path}", headers=headers, json={"prompt": "x"})
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{server}/health").status_code == 200  # probes need no key


def test_auth_scheme_is_case_insensitive(server):
    assert httpx.get(f"{server}/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200


def test_unknown_route_is_an_openai_404(server):
    r = httpx.get(f"{server}/v1/nothing", headers=AUTH)
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_metrics_are_prometheus_text(server, client):
    client.completions.create(model="coder", prompt=CODE[2], max_tokens=MAX_TOKENS)
    text = httpx.get(f"{server}/metrics").text
    for name in ("speclite_requests_total", "speclite_generation_tokens_total", "speclite_tokens_per_iteration",
                 'speclite_acceptance_rate{position="4"}', "speclite_queue_depth", "speclite_running"):
        assert name in text
    tokens = metric(server, "speclite_generation_tokens_total")
    iters = metric(server, "speclite_iterations_total")
    assert metric(server, "speclite_tokens_per_iteration") == pytest.approx(tokens / iters)
    assert metric(server, 'speclite_requests_total{outcome="ok"}') >= 1


async def _hold_stream(http, body, started: asyncio.Future | None = None):
    """Open a streaming request and keep it open; `started` resolves once its first event arrives."""
    async with http.stream("POST", "/v1/completions", json=body) as r:
        async for _ in r.aiter_lines():
            if started is not None and not started.done():
                started.set_result(True)


async def _until(condition, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_ends_the_requests_in_flight_and_stops_at_once(tmp_path, presses):
    """Ctrl-C (once, or twice in quick succession) with a request running and others waiting: every one
    ends now (the engine after its current iteration) with a 503 (the running one was a whole answer with
    finish_reason "abort", the waiting ones 499 "the client went away"), the server stops within a few
    seconds (it generated every queued answer in full first), exit 130 with the one line, no traceback (a
    second press printed uvicorn's lifespan task's)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "speclite.launch", "serve", *FLAGS, "--port", str(port),
                             "--max-queue", "16", "--temperature", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    url = f"http://127.0.0.1:{port}"
    wait_until_up(proc, url)
    long = {"prompt": "def main():\n", "max_tokens": 2000}  # ~0.5 s each
    answers = []

    def post():
        try:
            r = httpx.post(f"{url}/v1/completions", json=long, timeout=120)
            answers.append((r.status_code, r.json()["error"]["message"] if r.status_code != 200 else r.text))
        except httpx.TransportError:
            pass

    clients = [threading.Thread(target=post) for _ in range(17)]
    for c in clients:
        c.start()
    asyncio.run(_until(lambda: httpx.get(f"{url}/health").json()["waiting"] >= 12))
    for _ in range(presses):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    started = time.monotonic()
    _, err = proc.communicate(timeout=60)
    for c in clients:
        c.join(60)
    assert time.monotonic() - started < 4 and proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (
        "interrupted: the server stopped; requests still running were ended")
    if presses == 1:  # (a second press may close connections before their answers)
        assert sorted(answers) == [(503, "the server is stopping")] * 16 + [
            (503, "the server is stopping: the answer was cut short")], answers


def test_an_idle_engine_about_to_take_a_job_leaves_the_queue_its_places():
    """--max-queue 2 and three requests at once to an idle server: the engine thread had not yet taken the
    first off the queue, which counted it as waiting, and the third got a 429."""
    from speclite import SamplingParams
    from speclite.serve.metrics import Metrics
    from speclite.serve.protocol import ApiRequest
    from speclite.serve.worker import EngineWorker

    class Quiet:  # an LLM that answers nothing
        def stream(self, prompt, params, extra, result):
            return iter(())

    async def burst():
        worker = EngineWorker(Quiet(), max_queue=2, metrics=Metrics())
        request = ApiRequest("x", SamplingParams(max_new_tokens=1), {}, stream=False, include_usage=False)
        with worker.arrived:  # the engine thread cannot take a job meanwhile
            return [worker.submit(request) for _ in range(3)]

    assert len(asyncio.run(burst())) == 3


def test_help_shows_the_defaults_a_request_gets():
    """The sampling flags' help showed their own values (temperature 0.0, 256 tokens) where a request
    that sets neither flag nor field gets OpenAI's: temperature 1, up to the end of the context."""
    from click.testing import CliRunner

    from speclite.cli import cli

    text = " ".join(CliRunner().invoke(cli, ["serve", "--help"], terminal_width=200).output.split())
    assert "--temperature FLOAT 0 = greedy. [default: 1, OpenAI's]" in text
    assert "--max-new-tokens INTEGER [default: up to the end of the context]" in text and "256" not in text
