"""Sampled decoding's torch ops between forwards stay on the calling thread (kernels.cpu_threads)."""

from __future__ import annotations

import pytest
import torch
from conftest import torch_threads

from speclite.kernels.cpu_threads import one_thread
from speclite.sampling import SamplingParams, sample, warp


def test_one_thread_inside_and_the_count_restored_after_an_error():
    with torch_threads(2):
        with pytest.raises(RuntimeError):
            with one_thread(torch.device("cpu")):
                assert torch.get_num_threads() == 1
                raise RuntimeError("boom")
        assert torch.get_num_threads() == 2
        with one_thread(torch.device("meta")):  # not the CPU: torch's count untouched
            assert torch.get_num_threads() == 2


def test_warp_and_sample_run_their_torch_ops_on_one_thread(monkeypatch):
    """Where the kernels' sampling does not run (no kernels): torch's ops, on one thread."""
    from speclite.kernels import cpu_sampling

    monkeypatch.setattr(cpu_sampling, "takes", lambda x: False)
    seen = []
    for name in ("softmax", "cumsum"):
        real = getattr(torch.Tensor, name)

        def spy(self, *args, real=real, **kwargs):
            seen.append(torch.get_num_threads())
            return real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    monkeypatch.setattr(torch, "softmax", lambda x, dim: seen.append(torch.get_num_threads()) or x.softmax(dim))
    logits = torch.randn(3, 5000)
    with torch_threads(2):
        probs = warp(logits, SamplingParams(temperature=0.7, top_p=0.9))
        token = sample(probs[0], torch.rand(()))
        assert torch.get_num_threads() == 2
    assert seen and set(seen) == {1}, seen
    assert torch.allclose(probs.sum(-1), torch.ones(3)) and probs[0, token] > 0
