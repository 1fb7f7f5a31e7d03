"""CPU threads: --threads on every command that computes, and OpenMP's spinning bounded at import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from test_hardening import ASSETS, run_main


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_generate_runs_on_the_threads_asked_for(monkeypatch, capsys, tmp_path, restore_threads):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"prompt": "def add(a, b):", "max_new_tokens": 4}) + "\n")
    torch.set_num_threads(2)
    from speclite.cli import main

    monkeypatch.setattr(sys, "argv", ["speclite", "generate", "-m", str(ASSETS / "tiny-code"), "-i", str(inp),
                                      "-o", str(out), "--threads", "1"])
    main()
    assert torch.get_num_threads() == 1
    assert len(json.loads(out.read_text())["token_ids"]) == 4


@pytest.mark.parametrize("command", [["generate", "-i", "x.jsonl", "-o", "y.jsonl"], ["chat"], ["serve"],
                                     ["quantize", "m", "--scheme", "int4", "-o", "q"]])
@pytest.mark.parametrize("threads", ["0", "-2", "two"])
def test_bad_thread_counts_are_one_line(monkeypatch, capsys, command, threads, restore_threads):
    code, err = run_main(monkeypatch, capsys, [*command, "--threads", threads])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("error: Invalid value for '--threads'"), err


def _gomp_env(**env) -> dict:
    code = "import json, os, speclite; print(json.dumps({k: os.environ.get(k) for k in ('GOMP_SPINCOUNT', 'OMP_WAIT_POLICY')}))"
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_openmp_spinning_is_bounded_unless_the_user_chose():
    assert _gomp_env() == {"GOMP_SPINCOUNT": "1000", "OMP_WAIT_POLICY": None}
    assert _gomp_env(GOMP_SPINCOUNT="50000") == {"GOMP_SPINCOUNT": "50000", "OMP_WAIT_POLICY": None}
    assert _gomp_env(OMP_WAIT_POLICY="active") == {"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": "active"}
