"""An interrupted quantize leaves nothing that loads as a model; a re-run starts clean; output stays plain when piped."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from quant_helpers import save_random_checkpoint, save_tiny_model

import speclite.quant.writer as writer
from speclite.errors import SpecliteError
from speclite.model import load_model
from speclite.quant import quantize_to_dir
from speclite.quant.quantize import QuantProgress
from speclite.quant.writer import staging_dir


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_random_checkpoint(tmp_path_factory.mktemp("src") / "model", hidden=512, intermediate=1408, layers=12)


def quantize_cmd(src, out, *extra):
    return [sys.executable, "-m", "speclite.cli", "quantize", str(src), "--scheme", "int4", "-o", str(out),
            "--shard-size", "1", "--no-eval", *extra]


def interrupt(src, out, sig):
    """Start a quantize, send `sig` once its first shard is on disk, return the exit code and stderr."""
    proc = subprocess.Popen(quantize_cmd(src, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(staging_dir(out).glob("partial-*.safetensors")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.005)
    proc.send_signal(sig)
    stderr = proc.communicate(timeout=60)[1].decode()
    return proc.returncode, stderr


def assert_not_a_model(path):
    if path.exists():
        with pytest.raises(SpecliteError):
            load_model(path)
        from transformers import AutoConfig

        with pytest.raises((OSError, ValueError)):
            AutoConfig.from_pretrained(str(path))


def test_ctrl_c_leaves_nothing(model, tmp_path):
    out = tmp_path / "out"
    code, stderr = interrupt(model, out, signal.SIGINT)
    assert code == 130, stderr
    assert not out.exists() and not staging_dir(out).exists()
    assert os.listdir(tmp_path) == []


def test_ctrl_c_says_what_stands(tmp_path, monkeypatch, capsys):
    """Before the checkpoint is complete nothing was written; during the perplexity report after it, the
    checkpoint stands (a re-run would find OUT taken): the one line says which."""
    import speclite.quant.quantize as quantize
    from speclite.cli import main

    model = save_tiny_model(tmp_path / "src")  # with a tokenizer: the report runs

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt

    for phase, says in (("_emit", "interrupted: nothing was written; run the same command again"),
                        ("streamed_perplexity", "is written; its perplexity report was skipped")):
        with monkeypatch.context() as m:
            m.setattr(quantize, phase, ctrl_c)
            out = str(tmp_path / phase)
            m.setattr(sys, "argv", ["speclite", "quantize", str(model), "--scheme", "w8a8", "-o", out])
            with pytest.raises(SystemExit) as exit:
                main()
        err = capsys.readouterr().err  # the progress lines, then the one line of the Ctrl-C
        assert exit.value.code == 130 and says in err.splitlines()[-1] and "Traceback" not in err, err
    assert not (tmp_path / "_emit").exists() and load_model(tmp_path / "streamed_perplexity")


def test_kill_9_leaves_no_model_and_a_rerun_starts_clean(model, tmp_path):
    out = tmp_path / "out"
    assert interrupt(model, out, signal.SIGKILL)[0] == -signal.SIGKILL
    assert not out.exists()
    assert_not_a_model(staging_dir(out))  # the hidden staging directory has shards but never config.json
    run = subprocess.run(quantize_cmd(model, out), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert not staging_dir(out).exists() and sorted(os.listdir(tmp_path)) == ["out"]
    assert len(list(out.glob("model-*.safetensors"))) > 1
    load_model(out)


def test_too_little_disk_space_is_one_line_and_writes_nothing(model, tmp_path, monkeypatch):
    monkeypatch.setattr(writer.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 10 * 10**6))
    out = tmp_path / "out"
    with pytest.raises(SpecliteError, match=r"^not enough disk space in .*: the checkpoint needs 0\.\d+ GB, 0\.01 GB are free$"):
        quantize_to_dir(model, out, "w8a8", evaluate=False)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("how", ["working directory", "link"])
def test_an_empty_output_directory_is_filled_in_place(tmp_path, monkeypatch, how):
    """`-o .` from an empty directory, or a link to an empty one: the checkpoint lands in that very
    directory (a shell standing in it sees it; the link still leads to it)."""
    src = save_tiny_model(tmp_path / "src")
    target = tmp_path / "empty"
    target.mkdir()
    inode = target.stat().st_ino
    if how == "link":
        (tmp_path / "link").symlink_to("empty")
        out = tmp_path / "link"
    else:
        monkeypatch.chdir(target)
        out = "."
    quantize_to_dir(src, out, "int4", group_size=32, evaluate=False)
    assert target.stat().st_ino == inode and (tmp_path / "link" if how == "link" else target).resolve() == target
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["src", "empty"] + (["link"] if how == "link" else []))
    load_model(target)


def test_windows_past_the_context_are_cut_to_it(tmp_path):
    notes = []

    class Notes(QuantProgress):
        def note(self, message):
            notes.append(message)

    src = save_tiny_model(tmp_path / "src")
    context = load_model(src).args.max_position_embeddings
    quantize_to_dir(src, tmp_path / "out", "w8a8", method="smoothquant", seq_len=context * 4, evaluate=False,
                    progress=Notes())
    assert f"--seq-len is past the model's context: windows of {context} tokens" in notes


def test_piped_output_is_plain_and_verbose_lists_tensors(tmp_path):
    src = save_tiny_model(tmp_path / "tiny", hidden=64, intermediate=160)
    quiet = subprocess.run(quantize_cmd(src, tmp_path / "a"), capture_output=True, text=True, timeout=300)
    loud = subprocess.run(quantize_cmd(src, tmp_path / "b", "--verbose"), capture_output=True, text=True, timeout=300)
    for run in (quiet, loud):
        assert run.returncode == 0, run.stderr
        text = run.stdout + run.stderr
        assert "\x1b[" not in text and "\r" not in text  # no colours, no redrawn bar
        assert "skipped (--no-eval)" in run.stdout and "MB/s" in run.stdout
    assert "model.layers.1.mlp.down_proj.weight" in loud.stderr
    assert "model.layers.1.mlp.down_proj.weight" not in quiet.stderr
    assert len(loud.stderr.splitlines()) > len(quiet.stderr.splitlines()) + 20
