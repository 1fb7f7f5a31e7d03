"""A decoder layer in one C call (cpu_layer_ops.decoder_layer) gives the numbers of the same layer run
module by module (norms, joined projections, attention, residuals), bit for bit: prefill, decode,
and a token tree under its mask, dense and quantized, with and without q/k/v biases."""

from __future__ import annotations

import pytest
import torch

from speclite.kernels import cpu_layer_ops
from speclite.model.loader import load_model
from speclite.model.step import Tree
from speclite.quant.quantize import quantize_model

needs_kernels = pytest.mark.skipif(not cpu_layer_ops.available(), reason="no AVX2 CPU or no C++ compiler here")


def run_steps(model):
    """Logits and cache of a prefill, a decode step and a tree verification."""
    g = torch.Generator().manual_seed(5)
    vocab = model.args.vocab_size
    cache = model.new_cache(32)
    out = [model(torch.randint(0, vocab, (7,), generator=g), cache)]
    out.append(model(torch.randint(0, vocab, (1,), generator=g), cache))
    tree = Tree.of([-1, 0, 0, 1], "cpu")
    out.append(model.step(torch.randint(0, vocab, (5,), generator=g), cache, tree=tree).logits)
    return out, [t[:, :, :cache.length].clone() for layer in cache.layers for t in layer]


@needs_kernels
@pytest.mark.parametrize("quant", [None, "int4", "w8a8", "fp8-block"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_fused_layer_equals_the_modules_bit_for_bit(model_dirs, family, dtype, quant):
    model = load_model(model_dirs[family], device="cpu", dtype=dtype)
    if quant:
        model = quantize_model(model, quant, group_size=32)
    with torch.inference_mode():
        fused, fused_cache = run_steps(model)
        block = model.model.layers[0]
        x = torch.randn(1, model.args.hidden_size).to(dtype)
        assert isinstance(block.cpu_layer(x, model.new_cache(4).layers[0]), cpu_layer_ops.Layer)
        # A hook on a linear keeps every block on its modules (calibration relies on it).
        hooks = [b.self_attn.o_proj.register_forward_hook(lambda *_: None) for b in model.model.layers]
        assert block.cpu_layer(x, model.new_cache(4).layers[0]) is None
        modules, modules_cache = run_steps(model)
        for h in hooks:
            h.remove()
    for a, b in zip(fused + fused_cache, modules + modules_cache):
        assert torch.equal(a, b)
    assert all(torch.isfinite(t).all() for t in fused)
