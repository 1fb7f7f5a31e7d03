"""float32 CPU models keep 16-bit-exact linear weights and embedding tables in 16 bits
(speclite.model.narrow): the same logits and greedy chains (AVX-512: bit for bit), half the bytes,
and nothing narrowed that is not exact."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import make_tokenizer, save_model
from speclite import kernels
from speclite.api import LLM
from speclite.engine.memory import model_bytes
from speclite.kernels import cpu_build, cpu_gemm
from speclite.model import load_model
from speclite.model.decoder import Linear
from speclite.model.narrow import narrow
from speclite.sampling import SamplingParams

needs_kernels = pytest.mark.skipif(not cpu_gemm.available(), reason="no AVX2 CPU or no C++ compiler here")


def save_in(path, dtype, seed, tie=False, **kw):
    """A random Qwen2 model saved with its weights in `dtype` (bf16: as most checkpoints ship)."""
    model = save_model(path, "qwen2", seed=seed, hidden=96, layers=3, tie_word_embeddings=tie, **kw)
    model.to(dtype).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def bf16_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("narrow")
    return {"untied": save_in(root / "untied", torch.bfloat16, 3),
            "tied": save_in(root / "tied", torch.bfloat16, 4, tie=True),
            "fp32": save_in(root / "fp32", torch.float32, 5), "f16": save_in(root / "f16", torch.float16, 6)}


def linears(model):
    return [m for m in model.modules() if type(m) is Linear]


def logits_of(model, tokens: torch.Tensor) -> torch.Tensor:
    cache = model.new_cache(64)
    with torch.inference_mode():
        rows = [model.step(tokens[:-3], cache).logits]
        rows += [model.step(tokens[i : i + 1], cache).logits for i in range(len(tokens) - 3, len(tokens) - 1)]
        rows.append(model.step(tokens[-1:], cache).logits)  # prefill, two single steps, a last one
    return torch.cat(rows)


@needs_kernels
@pytest.mark.parametrize("which,half", [("untied", torch.bfloat16), ("tied", torch.bfloat16), ("f16", torch.float16)])
def test_a_16_bit_checkpoint_run_in_float32_keeps_its_weights_16_bit_with_the_same_logits(isa, bf16_dirs, which, half):
    wide, narrowed = (load_model(bf16_dirs[which], dtype=torch.float32) for _ in range(2))
    before = model_bytes(narrowed)
    saved = narrow(narrowed)
    for wide_m, m in zip(linears(wide) + [wide.model.embed_tokens], linears(narrowed) + [narrowed.model.embed_tokens]):
        assert m.weight.dtype == half and torch.equal(m.weight.float(), wide_m.weight)
        assert getattr(m, "bias", None) is None or m.bias.dtype == torch.float32
    tied = narrowed.lm_head.weight is narrowed.model.embed_tokens.weight
    assert tied == (which == "tied")  # a tie stays one tensor
    assert narrowed.dtype == torch.float32 and narrowed.new_cache(8).layers[0][0].dtype == torch.float32
    assert all(n.weight.dtype == torch.float32 for n in narrowed.modules() if type(n).__name__ == "RMSNorm")
    assert saved > 0 and model_bytes(narrowed) == before - saved
    tokens = torch.randint(0, narrowed.args.vocab_size, (20,), generator=torch.Generator().manual_seed(1))
    want, got = logits_of(wide, tokens), logits_of(narrowed, tokens)
    chains = [m.greedy_chain(int(tokens[0]), m.new_cache(64), 12, m.args.vocab_size) for m in (wide, narrowed)]
    assert got.dtype == torch.float32 and chains[1] is not None
    if isa == "avx2" and half == torch.bfloat16:  # AVX2 sums bf16 weights by halves: fp32, another order
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(got, want) and chains[0] == chains[1]


@needs_kernels
def test_a_float32_checkpoint_and_one_inexact_weight_keep_the_model_float32(bf16_dirs):
    fp32 = load_model(bf16_dirs["fp32"], dtype=torch.float32)
    assert narrow(fp32) == 0 and all(m.weight.dtype == torch.float32 for m in linears(fp32))
    almost = load_model(bf16_dirs["untied"], dtype=torch.float32)
    with torch.no_grad():
        almost.model.layers[1].mlp.down_proj.weight[3, 5] += 2.0 ** -20  # no longer a bf16 value
    assert narrow(almost) == 0 and all(m.weight.dtype == torch.float32 for m in linears(almost))


@needs_kernels
def test_a_weight_two_linears_share_is_narrowed_once_and_stays_shared():
    shared = nn.Parameter(torch.randn(8, 16).to(torch.bfloat16).float(), requires_grad=False)
    a, b, c = Linear(16, 8, bias=False), Linear(16, 8, bias=False), Linear(16, 8, bias=False)
    a.weight = b.weight = shared
    c.weight = nn.Parameter(torch.randn(8, 16).to(torch.bfloat16).float(), requires_grad=False)
    model = nn.Sequential(a, b, c)
    assert narrow(model, model) == 2 * 8 * 16 * 2  # once, though named twice
    assert a.weight is b.weight and a.weight.dtype == torch.bfloat16 and torch.equal(a.weight.float(), shared)


@needs_kernels
def test_a_view_sharing_a_narrowed_backbone_narrows_its_own_head(bf16_dirs):
    """A draft model and its token-map view (its own head of some rows, the blocks shared), narrowed in
    either order in one call, as a bench run with and without the map prepares them: every weight 16-bit."""
    from speclite.speculate import token_map

    for order in (0, 1):
        model = load_model(bf16_dirs["untied"], dtype=torch.float32)
        view = model.restricted(*token_map.restrict(model.lm_head, None, torch.arange(0, 40, 3), "the model"))
        narrow(*((model, view) if order == 0 else (view, model)))
        assert all(m.weight.dtype == torch.bfloat16 for m in linears(model) + linears(view)), order


def test_without_the_cpu_kernels_nothing_is_narrowed(monkeypatch, bf16_dirs):
    monkeypatch.setattr(cpu_gemm, "available", lambda: False)
    model = load_model(bf16_dirs["untied"], dtype=torch.float32)
    assert narrow(model) == 0 and all(m.weight.dtype == torch.float32 for m in linears(model))


@pytest.mark.parametrize("rows", [1, 4])
def test_a_narrowed_weight_on_torch_ops_is_widened(monkeypatch, rows):
    monkeypatch.setattr(cpu_gemm, "takes", lambda x: False)  # as without the kernels, or for a gradient
    w, b = torch.randn(12, 20).to(torch.bfloat16), torch.randn(12)
    x = torch.randn(rows, 20)
    torch.testing.assert_close(kernels.linear(x, w, b), torch.nn.functional.linear(x, w.float(), b))


@needs_kernels
def test_an_llm_narrows_target_and_draft_and_speculation_stays_plain_decoding(tmp_path):
    tok = make_tokenizer()
    target = save_in(tmp_path / "target", torch.bfloat16, 7, tokenizer=tok)
    draft = save_in(tmp_path / "draft", torch.bfloat16, 8, tokenizer=tok)
    params = SamplingParams(max_new_tokens=24)
    plain = LLM(target, dtype="float32")
    spec = LLM(target, {"method": "vanilla", "model": str(draft), "num_speculative_tokens": 3}, dtype="float32")
    wide = LLM(target, dtype="float32")
    for m in linears(wide.target):  # as loaded, before narrowing: the reference's numbers
        m.weight = nn.Parameter(m.weight.float(), requires_grad=False)
    models = [plain.target, spec.target, spec.engine.spec.proposer.model]
    assert all(m.weight.dtype == torch.bfloat16 for model in models for m in linears(model))
    for prompt in ["def add(a, b):", "for i in range(10):", "import os"]:
        want = plain.generate(prompt, params)[0].token_ids
        assert spec.generate(prompt, params)[0].token_ids == want
        if cpu_build.isa() != "avx2":  # AVX2 sums bf16 weights in another order: equal logits only elsewhere
            assert wide.generate(prompt, params)[0].token_ids == want
