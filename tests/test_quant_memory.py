"""quantize runs in bounded memory: a checkpoint larger than the memory it is allowed, for each scheme.

The limit is RLIMIT_DATA, set inside a subprocess after torch and speclite are imported: since Linux
4.7 it counts private writable memory (heap, anonymous mmaps: every tensor torch allocates) but not
read-only file mappings, so the memory-mapped source checkpoint and the page cache stay outside it,
as they should (the kernel can drop those pages). RLIMIT_AS would count torch's ~0.6 GB of virtual
reservations and every mapped input file, which says nothing about resident memory.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from quant_helpers import save_random_checkpoint

MB = 1024**2
BUDGET = 96 * MB  # anonymous memory allowed on top of the imported interpreter
SHARD = 16 * MB

SCRIPT = """
import resource, sys, torch
from speclite.quant import quantize_to_dir
from safetensors.torch import load_file
torch.ones(1024).sum()  # start torch's thread pool (its stacks count) before the limit
used = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmData:"))
resource.setrlimit(resource.RLIMIT_DATA, (used + int(sys.argv[4]), resource.RLIM_INFINITY))
quantize_to_dir(sys.argv[1], sys.argv[2], sys.argv[3], shard_bytes=int(sys.argv[5]), evaluate=False)
try:  # the limit binds: the checkpoint's size in memory does not fit
    bytearray(int(sys.argv[6]))
    print("UNBOUNDED")
except MemoryError:
    print("BOUNDED")
"""


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    # 12 blocks of 768 x 2048 (~7 M parameters each): ~170 MB of bf16, ~340 MB as float32.
    return save_random_checkpoint(tmp_path_factory.mktemp("big") / "model", hidden=768, intermediate=2048, layers=12)


def checkpoint_size(path):
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


@pytest.mark.parametrize("scheme", ["int4", "fp8-block", "w8a8"])
def test_quantize_fits_in_less_memory_than_the_checkpoint(big, tmp_path, scheme):
    size = checkpoint_size(big)
    assert size > BUDGET * 1.5
    out = tmp_path / "q"
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(big), str(out), scheme, str(BUDGET), str(SHARD), str(size)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "BOUNDED"
    files = sorted(out.glob("model-*.safetensors"))
    assert len(files) > 1 and (out / "config.json").exists()
    assert all(f.stat().st_size <= SHARD + MB for f in files)
