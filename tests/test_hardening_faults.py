"""Faults during a batch run: the disk filling up, a failing write, kill -9. Nothing finished is lost,
nothing is duplicated, the output stays valid JSONL, and a re-run ends with the uninterrupted run's
greedy token ids."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speclite.errors import SpecliteError

TINY = Path(__file__).resolve().parents[1] / "speclite" / "assets" / "tiny-code"
STEMS = ["def add(a, b):", "import os", "for i in range(", "class Config:", '{"id": 1, "name":', "while True:"]
N = 200
NEW_TOKENS = 4


def prompts(n):
    return [{"id": i, "prompt": f"{STEMS[i % len(STEMS)]} # {i}"} for i in range(n)]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]  # fails on any partial line


def cli(*args):
    env = {**{k: v for k, v in os.environ.items() if k != "SPECLITE_DEBUG"}, "OMP_NUM_THREADS": "1"}
    return [sys.executable, "-m", "speclite.cli", *map(str, args)], env


def run_cli(*args):
    cmd, env = cli(*args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def generate_args(inp, out):
    return ["generate", "--model", TINY, "-i", inp, "-o", out, "--max-new-tokens", NEW_TOKENS, "--device", "cpu"]


@pytest.fixture(scope="module")
def llm():
    from speclite import LLM

    return LLM(TINY, device="cpu")


@pytest.fixture(scope="module")
def reference(llm, tmp_path_factory):
    """id -> greedy token ids of an uninterrupted run over all N prompts."""
    from speclite.batch import parse_jobs, run_batch
    from speclite.sampling import SamplingParams

    root = tmp_path_factory.mktemp("reference")
    write_jsonl(root / "in.jsonl", prompts(N))
    run_batch(llm, parse_jobs(root / "in.jsonl", SamplingParams(max_new_tokens=NEW_TOKENS)), root / "out.jsonl")
    return {r["id"]: r["token_ids"] for r in read_jsonl(root / "out.jsonl")}


def assert_complete(out, n, reference):
    records = read_jsonl(out)
    assert [r["id"] for r in records] == list(range(n))  # every line once, in order, nothing duplicated
    assert {r["id"]: r["token_ids"] for r in records} == {i: reference[i] for i in range(n)}


def test_failing_write_stops_with_whole_records_and_resumes(llm, reference, tmp_path, monkeypatch):
    """A simulated full disk: one write lands half a record, the next fails with ENOSPC."""
    import speclite.batch as batch
    from speclite.sampling import SamplingParams

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(inp, prompts(30))
    jobs = batch.parse_jobs(inp, SamplingParams(max_new_tokens=NEW_TOKENS))
    real_write, state = os.write, {"records": 0, "cut": False}

    def full_disk(fd, data):
        if os.fstat(fd).st_ino != out.stat().st_ino:
            return real_write(fd, data)
        if state["records"] < 12:
            state["records"] += 1
            return real_write(fd, data)
        if not state["cut"]:
            state["cut"] = True
            return real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(batch.os, "write", full_disk)
    with pytest.raises(SpecliteError) as e:
        batch.run_batch(llm, jobs, out)
    monkeypatch.undo()
    message = str(e.value)
    assert "No space left on device" in message and "12 of 30 results are safely in it" in message
    assert "run the same command again" in message and len(message.splitlines()) == 1
    assert [r["id"] for r in read_jsonl(out)] == list(range(12))  # the half record was cut back off
    summary = batch.run_batch(llm, jobs, out)
    assert (summary.skipped, summary.done) == (12, 18)
    assert_complete(out, 30, reference)


def test_output_removed_mid_run_stops_in_one_line(llm, tmp_path):
    from speclite.batch import parse_jobs, run_batch
    from speclite.sampling import SamplingParams

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(inp, prompts(5))
    jobs = parse_jobs(inp, SamplingParams(max_new_tokens=NEW_TOKENS))
    with pytest.raises(SpecliteError, match="removed or replaced during the run.*run the same command again"):
        run_batch(llm, jobs, out, on_result=lambda record: out.unlink() if record["id"] == 1 else None)


def mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_disk_full_on_a_real_tmpfs_then_resume(reference, tmp_path):
    mnt = tmp_path / "mnt"
    if not mount_tmpfs(mnt, "256k"):
        pytest.skip("needs root and tmpfs (the simulated full disk above covers the logic)")
    try:
        filler = mnt / "filler"
        filler.write_bytes(os.urandom(256 * 1024 - 8192))  # leaves two 4 KiB pages: room for a dozen records
        inp, out = tmp_path / "in.jsonl", mnt / "out.jsonl"
        write_jsonl(inp, prompts(40))
        r = run_cli(*generate_args(inp, out))
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "No space left on device" in errors[0], r.stderr
        saved = read_jsonl(out)  # whole records only
        assert 0 < len(saved) < 40 and f"{len(saved)} of 40 results are safely in it" in errors[0]
        filler.unlink()  # free the space, run the same command again
        r = run_cli(*generate_args(inp, out))
        assert r.returncode == 0, r.stderr
        assert f"{40 - len(saved)} done, 0 failed, {len(saved)} already in" in r.stderr
        assert_complete(out, 40, reference)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_kill_9_mid_run_then_rerun_equals_an_uninterrupted_run(reference, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(inp, prompts(N))
    cmd, env = cli(*generate_args(inp, out))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 300
    while time.time() < deadline and (not out.exists() or out.read_text().count("\n") < 20):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    text = out.read_text()
    finished = text.count("\n")
    assert 20 <= finished < N
    whole = [json.loads(line) for line in text.splitlines()[:finished]]  # every finished line intact
    assert [r["id"] for r in whole] == list(range(finished))
    r = run_cli(*generate_args(inp, out))
    assert r.returncode == 0, r.stderr
    assert_complete(out, N, reference)
