"""The Triton GEMMs pick one launch config for every decode and verification row count of a shape,
so each row's K sum runs in one order whatever rows share the call: a k + 1-row verification gives
a token the logits of its one-row step (on a GPU the tuner's picks per M broke that)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (speclite.kernels imports it lazily)

import pytest
import torch

pytest.importorskip("triton")

from speclite.kernels import fp8_block_triton, int8_triton, tuning, w4a16_triton  # noqa: E402

ROWS = [1, 2, 5, 9, 16, 17, 33, 65]  # a decode step; verifications of k = 1 .. 64 drafts


def gemms(gen):
    k, n = 256, 48
    qweight = torch.randint(-2**31, 2**31 - 1, (k // 8, n), generator=gen, dtype=torch.int64).to(torch.int32)
    qzeros = torch.randint(-2**31, 2**31 - 1, (k // 128, n // 8), generator=gen, dtype=torch.int64).to(torch.int32)
    scales = (torch.rand(k // 128, n, generator=gen) * 0.02 + 0.005).half()
    w8, w8_scale = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8), torch.rand(n, 1, generator=gen)
    fp8, fp8_scale = (torch.randn(n, k, generator=gen) * 0.5).to(torch.float8_e4m3fn), torch.rand(1, 2, generator=gen)
    return {
        "w4a16": lambda x: w4a16_triton.w4a16_gemm(x, qweight, qzeros, scales, None, 128),
        "int8": lambda x: int8_triton.int8_gemm(x, w8, w8_scale * 0.01 + 0.001),
        "fp8_block": lambda x: fp8_block_triton.fp8_block_gemm(x, fp8, fp8_scale * 0.01, (128, 128)),
    }


@pytest.mark.parametrize("kernel", ["w4a16", "int8", "fp8_block"])
def test_every_decode_and_verification_row_count_shares_one_config(kernel, monkeypatch):
    keys = []

    def pick(key, candidates, run, device):  # the tuner, recording what it is asked
        keys.append(key)
        return candidates[0]

    monkeypatch.setattr(tuning, "pick", pick)
    gen = torch.Generator().manual_seed(0)
    gemm = gemms(gen)[kernel]
    x = torch.randn(max(ROWS), 256, generator=gen).to(torch.bfloat16)
    outputs = {m: gemm(x[:m]) for m in ROWS}
    assert len(set(keys)) == 1, keys
    for m in ROWS:  # and each row is its one-row call's, bit for bit
        assert torch.equal(outputs[m], torch.cat([outputs[1]] + [gemm(x[i:i + 1]) for i in range(1, m)])), m
    gemm(torch.randn(200, 256, generator=gen).to(torch.bfloat16))  # a prefill: a config of its own
    assert len(set(keys)) == 2


def test_w4a16_decode_candidates_are_whole_packed_words_inside_a_group(monkeypatch):
    """With 128-channel groups and no act-order gather, a decode / verification GEMM tunes over
    BLOCK_K 128 tiles only (the kernel's fast tiles); gathered groups keep every candidate."""
    asked = []
    monkeypatch.setattr(tuning, "pick", lambda key, candidates, run, device: asked.append(candidates) or candidates[0])
    gen = torch.Generator().manual_seed(1)
    k, n = 512, 64
    qweight = torch.randint(-2**31, 2**31 - 1, (k // 8, n), generator=gen, dtype=torch.int64).to(torch.int32)
    qzeros = torch.randint(-2**31, 2**31 - 1, (k // 128, n // 8), generator=gen, dtype=torch.int64).to(torch.int32)
    scales = (torch.rand(k // 128, n, generator=gen) * 0.02 + 0.005).half()
    x = torch.randn(3, k, generator=gen).to(torch.bfloat16)
    w4a16_triton.w4a16_gemm(x, qweight, qzeros, scales, None, 128)
    w4a16_triton.w4a16_gemm(x, qweight, qzeros, scales, (torch.randperm(k, generator=gen) // 128).int(), 128)
    whole, gathered = asked
    assert whole and all(c.block_k == 128 for c in whole)
    assert gathered == tuning.gemm_candidates(3, lambda bk: -(-k // bk))
