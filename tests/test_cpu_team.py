"""The CPU kernels' thread team (kernels/cpu/team.h): teams of any size give one thread's numbers,
callers on several Python threads take turns, a forked child runs its own workers, and where no
worker can be started the caller computes alone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import torch_threads

from speclite.kernels import cpu_gemm

pytestmark = pytest.mark.skipif(not cpu_gemm.available(), reason="no AVX2 CPU or no C++ compiler here")


def _problems(seed: int, count: int = 4):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        m, k, n = 1 + 3 * i, 64 + 32 * i, 200 + 56 * i
        x = torch.randn(m, k, generator=g)
        mats = cpu_gemm.dense_matrices([torch.randn(n, k, generator=g)])
        out.append((x, mats))
    return out


def test_teams_of_every_size_give_one_threads_numbers():
    problems = _problems(0)
    with torch_threads(1):
        alone = [cpu_gemm.matmul(x, m) for x, m in problems]
    # The pool grows to 4 workers, then serves smaller teams (idle workers take no share).
    for n in (2, 3, 5, 2, 4):
        with torch_threads(n):
            got = [cpu_gemm.matmul(x, m) for x, m in problems]
        assert all(torch.equal(a, b) for a, b in zip(got, alone)), n


def test_callers_on_several_threads_take_turns():
    problems = _problems(1)
    with torch_threads(1):
        expected = [cpu_gemm.matmul(x, m) for x, m in problems]
    failures = []

    def caller(offset: int):
        for i in range(60):
            j = (i + offset) % len(problems)
            if not torch.equal(cpu_gemm.matmul(*problems[j]), expected[j]):
                failures.append((offset, i))

    def run_callers():
        callers = [threading.Thread(target=caller, args=(o,)) for o in range(4)]
        for c in callers:
            c.start()
        for c in callers:
            c.join(timeout=120)
        return [c for c in callers if c.is_alive()]

    with torch_threads(2):
        stuck = run_callers()
    assert not stuck and not failures


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_starts_its_own_workers():
    (x, mats), = _problems(2, 1)
    with torch_threads(1):
        expected = cpu_gemm.matmul(x, mats)
    with torch_threads(2):
        cpu_gemm.matmul(x, mats)  # the parent's workers exist now
    pid = os.fork()
    if pid == 0:  # the child: its team's workers are not the parent's, which it does not have
        try:
            with torch_threads(2):
                same = all(torch.equal(cpu_gemm.matmul(x, mats), expected) for _ in range(5))
            os._exit(0 if same else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's team never finished")


LIMITED = """
import resource, torch
from speclite.kernels import cpu_gemm
torch.manual_seed(0)
x, mats = torch.randn(3, 64), cpu_gemm.dense_matrices([torch.randn(50, 64)])
torch.set_num_threads(1)
alone = cpu_gemm.matmul(x, mats)
# The address space as mapped now plus 1 MB: a worker's stack cannot be mapped.
mapped = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 20), resource.RLIM_INFINITY))
torch.set_num_threads(2)
print(all(torch.equal(cpu_gemm.matmul(x, mats), alone) for _ in range(3)))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="no /proc here")
def test_a_team_with_no_thread_to_start_computes_with_the_caller_alone():
    done = subprocess.run([sys.executable, "-c", LIMITED], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split()[-1:] == ["True"], done.stderr[-2000:]
