import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (speclite.kernels imports it lazily)

import pytest
import torch

from speclite.kernels import verify_greedy, verify_rejection
from speclite.kernels.verify import verify_rejection_torch


def probs(rows, vocab, gen, sharpness=2.0):
    return torch.softmax(torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * sharpness, dim=-1).float()


def make_case(k, vocab, seed, with_draft=True):
    """Draft rows q, target rows p near q (so both accepts and rejects happen), tokens drawn from q."""
    gen = torch.Generator().manual_seed(seed)
    q = probs(max(k, 1), vocab, gen)[:k]
    p = probs(k + 1, vocab, gen)
    p[:k] = (0.6 * q + 0.4 * p[:k]) / (0.6 * q + 0.4 * p[:k]).sum(-1, keepdim=True)
    tokens = torch.multinomial(q, 1, generator=gen).view(-1) if k else torch.zeros(0, dtype=torch.int64)
    u = torch.rand(k, generator=gen)
    ru = torch.rand(1, generator=gen)
    return tokens, (q if with_draft else None), p, u, ru


def inverse_cdf(weights, u):
    target = u * sum(weights)
    c = 0.0
    for j, w in enumerate(weights):
        c += w
        if c > target:
            return j
    return max(j for j, w in enumerate(weights) if w > 0)


def leviathan_loop(tokens, q, p, u, ru):
    """Direct transcription of Leviathan et al. in float64 Python, one position at a time."""
    k, vocab = len(tokens), p.shape[1]
    for i in range(k):
        x = int(tokens[i])
        q_row = [float(v) for v in q[i]] if q is not None else [1.0 if j == x else 0.0 for j in range(vocab)]
        p_row = [float(v) for v in p[i]]
        if float(u[i]) < min(1.0, p_row[x] / q_row[x]):
            continue
        residual = [max(0.0, a - b) for a, b in zip(p_row, q_row)]
        if sum(residual) == 0.0:
            residual = p_row
        return i, inverse_cdf(residual, float(ru))
    return k, inverse_cdf([float(v) for v in p[k]], float(ru))


@pytest.mark.parametrize("with_draft", [True, False])
def test_rejection_reference_matches_python_loop(with_draft):
    outcomes = set()
    for seed in range(100):
        k = seed % 6
        tokens, q, p, u, ru = make_case(k, 23, seed, with_draft)
        n, tok = verify_rejection_torch(tokens, q, p, u, ru)
        assert n.dtype == torch.int64 and tok.dtype == torch.int64 and n.dim() == 0 and tok.dim() == 0
        assert (int(n), int(tok)) == leviathan_loop(tokens, q, p, u, ru), seed
        outcomes.add(int(n) == k)
    assert outcomes == {True, False}  # both the bonus and the correction paths were exercised


def test_rejection_is_lossless_for_k1_by_enumeration():
    """Over all draft tokens x ~ q and a fine grid of both uniforms, the first emitted token is distributed as p."""
    grid = 256
    us = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    p = torch.tensor([[0.30, 0.05, 0.25, 0.10, 0.20, 0.10], [0.1, 0.2, 0.3, 0.2, 0.1, 0.1]])
    q = torch.tensor([[0.10, 0.30, 0.20, 0.25, 0.05, 0.10]])
    emitted = torch.zeros(6, dtype=torch.float64)
    for x in range(6):
        tokens = torch.tensor([x])
        accepted = sum(int(verify_rejection_torch(tokens, q, p, torch.tensor([float(u)]), 0.5)[0]) for u in us) / grid
        emitted[x] += q[0, x] * accepted
        if accepted < 1:
            for ru in us:
                n, tok = verify_rejection_torch(tokens, q, p, torch.tensor([0.999]), float(ru))
                assert int(n) == 0
                emitted[int(tok)] += q[0, x] * (1 - accepted) / grid
    torch.testing.assert_close(emitted, p[0].double(), rtol=0, atol=2.0 / grid)
    # the bonus token (all accepted) follows p[1]
    bonus = torch.zeros(6, dtype=torch.float64)
    for ru in us:
        n, tok = verify_rejection_torch(torch.tensor([0]), q, p, torch.tensor([0.0]), float(ru))
        assert int(n) == 1
        bonus[int(tok)] += 1.0 / grid
    torch.testing.assert_close(bonus, p[1].double(), rtol=0, atol=1.0 / grid)


def test_rejection_degenerate_residual_samples_target():
    p_row = torch.tensor([0.2, 0.3, 0.5]) * 0.999  # p < q everywhere: the residual is all zero
    q = torch.tensor([[0.2, 0.3, 0.5]])
    p = torch.stack([p_row, torch.tensor([1.0, 0.0, 0.0])])
    for ru, expected in [(0.1, 0), (0.3, 1), (0.9, 2)]:
        n, tok = verify_rejection_torch(torch.tensor([2]), q, p, torch.tensor([0.9995]), ru)
        assert (int(n), int(tok)) == (0, expected)


def test_greedy_reference_matches_python_loop_with_ties():
    gen = torch.Generator().manual_seed(0)
    for k in range(5):
        logits = torch.randint(0, 4, (k + 1, 9), generator=gen).float()  # many ties
        best = [max(range(9), key=lambda j: (logits[i, j].item(), -j)) for i in range(k + 1)]
        for n_match in range(k + 1):
            tokens = torch.tensor(best[:k])
            if n_match < k:
                tokens[n_match] = (best[n_match] + 1) % 9
            n, tok = verify_greedy(tokens, logits)
            assert (int(n), int(tok)) == (n_match, best[n_match])


def test_rejection_on_cpu_takes_torch_path():
    tokens, q, p, u, ru = make_case(3, 17, 5)
    assert [int(v) for v in verify_rejection(tokens, q, p, u, ru)] == [int(v) for v in verify_rejection_torch(tokens, q, p, u, ru)]


# Triton under the interpreter: outputs must equal the reference exactly for the same uniforms.
@pytest.mark.parametrize("vocab", [37, 4500])  # 4500 spans three 2048-wide blocks
@pytest.mark.parametrize("with_draft", [True, False])
def test_triton_rejection_equals_reference(vocab, with_draft):
    triton_mod = pytest.importorskip("speclite.kernels.verify_triton")
    outcomes = set()
    for seed in range(12):
        k = seed % 6
        tokens, q, p, u, ru = make_case(k, vocab, seed + vocab, with_draft)
        got = [int(v) for v in triton_mod.verify_rejection(tokens, q, p, u, ru)]
        assert got == [int(v) for v in verify_rejection_torch(tokens, q, p, u, ru)], seed
        outcomes.add(got[0] == k)
    assert outcomes == {True, False}


def test_triton_rejection_on_exact_cdf_boundaries_and_degenerate_residual():
    triton_mod = pytest.importorskip("speclite.kernels.verify_triton")
    p = torch.tensor([[0.25, 0.0, 0.5, 0.25], [0.125, 0.375, 0.25, 0.25]])  # masses exact in fixed point
    q = torch.tensor([[0.5, 0.0, 0.25, 0.25]])
    for ru in [0.0, 0.125, 0.25, 0.5, 0.625, 0.75, 0.9999]:
        for u in [0.0, 0.4999, 0.5, 0.9]:
            args = (torch.tensor([0]), q, p, torch.tensor([u]), torch.tensor([ru]))
            assert [int(v) for v in triton_mod.verify_rejection(*args)] == [int(v) for v in verify_rejection_torch(*args)]
    p_degenerate = torch.stack([q[0] * 0.999, p[1]])
    for ru in [0.1, 0.3, 0.9]:
        args = (torch.tensor([0]), q, p_degenerate, torch.tensor([0.9995]), ru)
        expected = [int(v) for v in verify_rejection_torch(*args)]
        assert expected[0] == 0 and [int(v) for v in triton_mod.verify_rejection(*args)] == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_ties_across_a_wide_vocabulary_take_the_lowest_index(dtype):
    gen = torch.Generator().manual_seed(1)
    for k in range(5):
        logits = torch.randn(k + 1, 4500, generator=gen).to(dtype)
        logits[:, [700, 2100, 4400]] = 10.0  # the lowest index must win, as torch.argmax documents
        best = logits.argmax(-1)
        for n_match in range(k + 1):
            tokens = best[:k].clone()
            if n_match < k:
                tokens[n_match] = 5
            assert [int(v) for v in verify_greedy(tokens, logits)] == [n_match, 700]
