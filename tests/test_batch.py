"""`speclite generate`: the JSONL contract, resume, bad lines, interruption, clear errors."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest


def run_cli(*args, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "speclite.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kw)


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def target(pair):
    return pair[0]


def test_schema_bad_lines_and_resume(tmp_path, target):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(inp, [
        {"id": "a", "prompt": "def add(a, b):"},
        "{not json",
        {"id": "b", "messages": [{"role": "user", "content": "hi"}], "max_new_tokens": 3},
        {"id": "c"},
        {"id": "d", "prompt": "the quick", "temperature": 0.8, "seed": 1, "stop": ["\n"]},
        {"id": "e", "prompt": "import os", "temperature": -1},
    ])
    r = run_cli("generate", "--model", target, "-i", inp, "-o", out, "--max-new-tokens", 6)
    assert r.returncode == 1 and r.stderr.splitlines()[-1].startswith("error: 3 of 6 lines failed"), r.stderr
    recs = read_jsonl(out)
    assert [r.get("id", r.get("line")) for r in recs] == ["a", 2, "b", "c", "d", "e"]
    good = {r["id"]: r for r in recs if "text" in r}
    assert set(good) == {"a", "b", "d"}
    assert len(good["b"]["token_ids"]) <= 3 and len(good["a"]["token_ids"]) <= 6
    aux = good["a"]["aux_info"]
    for key in ("cost_time_ms", "output_len", "iter_count", "avg_tokens_per_iter", "accept_rate",
                "accepted_per_position", "draft_time_ms", "verify_time_ms"):
        assert key in aux
    assert good["a"]["finish_reason"] in ("stop", "length")
    errors = {r.get("id", r.get("line")): r["error"] for r in recs if "error" in r}
    assert "not valid JSON" in errors[2] and "prompt" in errors["c"] and "temperature" in errors["e"]
    assert "summary" not in r.stdout  # results go to the file, the table to stderr
    # Re-running skips every result already recorded; the lines that ended in an error run again (their
    # records replaced: one fixed since gets its result) and a new line is run.
    lines = inp.read_text().splitlines()
    lines[5] = json.dumps({"id": "e", "prompt": "import os", "temperature": 0})
    inp.write_text("\n".join(lines + [json.dumps({"id": "f", "prompt": "for i in"})]) + "\n")
    r = run_cli("generate", "--model", target, "-i", inp, "-o", out, "--max-new-tokens", 4)
    assert r.returncode == 1, r.stderr
    recs2 = read_jsonl(out)
    assert recs2[:3] == [good["a"], good["b"], good["d"]]
    assert [x.get("id", x.get("line")) for x in recs2[3:]] == [2, "c", "e", "f"]
    assert "error" in recs2[3] and "error" in recs2[4] and "text" in recs2[5] and "text" in recs2[6]
    assert "2 done, 2 failed, 3 already in" in r.stderr


def test_a_fixed_line_without_an_id_replaces_its_error_record(tmp_path, target):
    """Lines without ids whose errors were keyed by line number (an empty prompt, broken JSON): fixed,
    they ran and their old error records stayed beside the results for good."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(inp, [{"id": "a", "prompt": "def f(x):"}, {"prompt": ""}, '{"prompt": "broken'])
    assert run_cli("generate", "--model", target, "-i", inp, "-o", out, "--max-new-tokens", 3).returncode == 1
    write_jsonl(inp, [{"id": "a", "prompt": "def f(x):"}, {"prompt": "import os"}, {"prompt": "class A:"}])
    for _ in range(2):
        r = run_cli("generate", "--model", target, "-i", inp, "-o", out, "--max-new-tokens", 3)
        assert r.returncode == 0, r.stderr
        recs = read_jsonl(out)
        assert [x.get("id", x.get("line")) for x in recs] == ["a", 2, 3] and all("text" in x for x in recs), recs


def test_a_linked_output_is_written_through_its_link(tmp_path, target):
    """Retrying an error record rewrites the output: through a link, the link's target (the link was
    replaced by a file, its target kept the stale error)."""
    inp, store, out = tmp_path / "in.jsonl", tmp_path / "store", tmp_path / "out.jsonl"
    store.mkdir()
    out.symlink_to(store / "real.jsonl")
    write_jsonl(inp, [{"id": "a", "prompt": "def f(x):"}, {"id": "b", "prompt": ""}])
    assert run_cli("generate", "--model", target, "-i", inp, "-o", out, "--max-new-tokens", 3).returncode == 1
    write_jsonl(inp, [{"id": "a", "prompt": "def f(x):"}, {"id": "b", "prompt": "import os"}])
    assert run_cli("generate", "--model", target, "-i", inp, "-o", out, "--max-new-tokens", 3).returncode == 0
    assert out.is_symlink() and [x["id"] for x in read_jsonl(store / "real.jsonl") if "text" in x] == ["a", "b"]


def test_echo_prints_ids_and_texts_as_they_are(tmp_path, target):
    """An id of rich markup ended the run (MarkupError) or printed altered; :smile: became an emoji."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = ["[b]bold[/b]", "[/]", ":smile:"]
    write_jsonl(inp, [{"id": i, "prompt": "def f(x):"} for i in ids])
    r = run_cli("generate", "--model", target, "-i", inp, "-o", out, "--max-new-tokens", 3, "--echo")
    assert r.returncode == 0, r.stderr
    texts = [x["text"] for x in read_jsonl(out)]
    assert [x["id"] for x in read_jsonl(out)] == ids
    assert all(i in r.stdout for i in ids) and all(t in r.stdout for t in texts), r.stdout


def test_a_byte_order_mark_begins_the_first_line(tmp_path, target):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "a", "prompt": "def f(x):"}).encode() + b"\n")
    r = run_cli("generate", "--model", target, "-i", inp, "-o", out, "--max-new-tokens", 3)
    assert r.returncode == 0 and "text" in read_jsonl(out)[0], r.stderr


def test_repeated_ids_and_undecodable_lines_are_error_records(tmp_path, target):
    """An id used by an earlier line (a line without one takes its line number) would make a resumed
    run skip that line as done: an error record keyed by its line, whether or not the run resumes; a
    line that is not UTF-8 is an error record and the rest runs."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in [
        {"id": 3, "prompt": "def"}, {"id": "3", "prompt": "for"}, {"prompt": "import"}, {"id": 3, "prompt": "x"}])
        + b'{"prompt": "caf\xe9"}\n' + json.dumps({"id": "z", "prompt": "while"}).encode() + b"\n")
    r = run_cli("generate", "--model", target, "-i", inp, "-o", out, "--max-new-tokens", 3)
    assert r.returncode == 1, r.stderr
    recs = read_jsonl(out)
    assert [x.get("id", x.get("line")) for x in recs] == [3, "3", 3, 4, 5, "z"]
    assert [x["line"] for x in recs if "error" in x] == [3, 4, 5]
    errors = [x["error"] for x in recs if "error" in x]
    assert "line number (it has no id) 3 is line 1's id" in errors[0] and "its id 3 is line 1's id" in errors[1]
    assert "not valid UTF-8" in errors[2]
    assert "3 done, 3 failed" in r.stderr
    # Resumed after the first record only: the same records, none lost.
    out.write_text(out.read_text().splitlines()[0] + "\n")
    r = run_cli("generate", "--model", target, "-i", inp, "-o", out, "--max-new-tokens", 3)
    assert [x.get("id", x.get("line")) for x in read_jsonl(out)] == [3, "3", 3, 4, 5, "z"], r.stderr


def test_interrupt_loses_nothing_finished(tmp_path, target):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(inp, [{"id": i, "prompt": "def add(a, b):"} for i in range(400)])
    proc = subprocess.Popen([sys.executable, "-m", "speclite.cli", "generate", "--model", str(target), "-i", str(inp),
                             "-o", str(out), "--max-new-tokens", "40", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "run the same command again to resume" in err and "Traceback" not in err
    done = read_jsonl(out)  # every line whole: nothing half-written
    assert 2 <= len(done) < 400 and [r["id"] for r in done] == list(range(len(done)))
    # Resume finishes the rest without redoing any.
    write_jsonl(inp, [{"id": i, "prompt": "def add(a, b):"} for i in range(len(done) + 3)])
    r = run_cli("generate", "--model", target, "-i", inp, "-o", out, "--max-new-tokens", 4)
    assert r.returncode == 0, r.stderr
    assert [x["id"] for x in read_jsonl(out)] == list(range(len(done) + 3))


def test_truncated_last_line_is_rerun(tmp_path, target):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(inp, [{"id": "a", "prompt": "def"}, {"id": "b", "prompt": "for"}])
    out.write_text(json.dumps({"id": "a", "text": "x", "token_ids": [1]}) + '\n{"id": "b", "te')
    r = run_cli("generate", "--model", target, "-i", inp, "-o", out, "--max-new-tokens", 3)
    assert r.returncode == 0, r.stderr
    # The cut record is dropped, not kept as a broken line: the file stays valid JSONL.
    assert [r["id"] for r in read_jsonl(out)] == ["a", "b"]


@pytest.mark.parametrize("args, message", [
    (["generate", "--model", "no-such-alias", "-i", "{inp}", "-o", "{out}"], "unknown model 'no-such-alias'"),
    # A mistyped directory is no repo id either (the hub's own validation error was an internal error).
    (["generate", "--model", "mymodel/", "-i", "{inp}", "-o", "{out}"], "unknown model 'mymodel/'"),
    (["pull", "./mymodel"], "unknown model './mymodel'"),
    (["generate", "--model", "{target}", "-i", "{tmp}/missing.jsonl", "-o", "{tmp}/made/out.jsonl"], "input file not found"),
    (["generate", "--model", "{target}", "-i", "{inp}", "-o", "{inp}/out.jsonl"], "in.jsonl is a file, not a folder"),
    (["generate", "--model", "{target}", "-i", "{inp}", "-o", "/proc/forbidden/out.jsonl"], "cannot write the output"),
    (["generate", "--model", "{target}", "-i", "{inp}", "-o", "{out}", "--sp-type", "vanilla"], "needs --draft"),
    (["generate", "--model", "{target}", "-i", "{inp}", "-o", "{out}", "--sp-type", "deterministic", "--gen-num-per-cycle",
      "x"], "a number or 'auto'"),
    (["generate", "--model", "{tmp}", "-i", "{inp}", "-o", "{out}"], "not a model directory"),
    (["generate", "--model", "{target}", "-i", "{inp}", "-o", "{out}", "--max-model-len", "0"], "at least 2 tokens"),
    (["generate", "--model", "{target}", "-i", "{inp}", "-o", "{out}", "--quant", "q3"], "unknown quantization scheme"),
    (["generate", "--model", "Qwen2.5-0.5B", "-i", "{inp}", "-o", "{out}"], "not cached and the hub cannot be reached"),
    (["pull", "Qwen/Qwen2.5-0.5B-Instruct"], "connect to the network"),
])
def test_bad_input_is_one_clear_line(tmp_path, target, args, message):
    inp = tmp_path / "in.jsonl"
    write_jsonl(inp, [{"id": 1, "prompt": "hi"}])
    fill = dict(inp=inp, out=tmp_path / "out.jsonl", target=target, tmp=tmp_path)
    r = run_cli(*[a.format(**fill) for a in args], env={**os.environ, "HF_HUB_OFFLINE": "1",
                                                        "HF_HOME": str(tmp_path / "hf")})
    assert r.returncode != 0
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "made").exists()  # a run that never started leaves no output behind
