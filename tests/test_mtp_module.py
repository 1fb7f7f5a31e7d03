"""MTP modules load from both published layouts and compute what the architecture says (float64
references), MiMo runs as a target, the target loader names the module tensors it leaves, and a
module that does not fit its target is a one-line error."""

import json
import logging

import pytest
import torch
from safetensors.torch import load_file

from conftest import save_model
from mtp_modules import add_module, reference_decoder, reference_module, save_separate
from speclite.errors import SpecliteError
from speclite.model import load_model
from speclite.model.step import Wants
from speclite.quant.linear import Int4Linear
from speclite.speculate.mtp import load_draft

SEQ = [5, 17, 3, 99, 42, 7, 250, 11, 64]


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """{layout: (target dir, module tensors)}: a Llama with a DeepSeek-V3 module, a MiMo target."""
    root = tmp_path_factory.mktemp("mtp-targets")
    save_model(root / "deepseek", "llama", seed=3, hidden=64, layers=3, intermediate_size=96)
    save_model(root / "mimo", "qwen2", seed=4, hidden=64, layers=3, intermediate_size=96, tie_word_embeddings=False)
    return {layout: (root / layout, add_module(root / layout, layout, seed=9)) for layout in ("deepseek", "mimo")}


def test_mimo_target_logits_match_a_float64_reference(targets, caplog):
    path, _ = targets["mimo"]
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["MiMoForCausalLM"]
    with caplog.at_level(logging.WARNING):
        target = load_model(path, "cpu", torch.float32)
    assert "model.mtp_layers.0.*" in caplog.text  # the loader says what it left for --sp-type mtp
    with torch.inference_mode():
        logits = target(torch.tensor(SEQ), target.new_cache(32))
    ref, _ = reference_decoder(load_file(str(path / "model.safetensors")), cfg, SEQ)
    torch.testing.assert_close(logits.double(), ref, rtol=1e-4, atol=1e-4)


def test_loader_notes_deepseek_module_tensors(targets, caplog):
    with caplog.at_level(logging.WARNING):
        load_model(targets["deepseek"][0], "cpu", torch.float32)
    assert "model.layers.3.*" in caplog.text and "--sp-type mtp" in caplog.text


@pytest.mark.parametrize("layout", ["deepseek", "mimo"])
def test_module_steps_match_a_float64_reference(targets, layout):
    """The committed pairs in one call, then two chained steps fed the module's own state."""
    path, t = targets[layout]
    cfg = json.loads((path / "config.json").read_text())
    target = load_model(path, "cpu", torch.float32)
    module = load_draft(None, target)
    embed = target.model.embed_tokens.weight.detach()
    with torch.inference_mode():
        states = target.step(torch.tensor(SEQ), target.new_cache(32), wants=Wants(final=True)).final
        cache = module.new_cache(32)
        n = len(SEQ) - 1
        positions = torch.arange(n)
        logits, out = module(embed[SEQ[1:]], states[:n], positions, cache, None)
        ref_logits, ref_out = reference_module(t, layout, cfg, embed[SEQ[1:]], states[:n], positions,
                                               target.lm_head.weight)
        torch.testing.assert_close(logits.double(), ref_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.double(), ref_out, rtol=1e-4, atol=1e-4)
        # Chained: all rows at once in the reference (causal), one by one through the module's cache.
        rows_e, rows_s, last = [embed[SEQ[1:]]], [states[:n]], out[-1:]
        for step in range(2):
            token = int(torch.argmax(logits[-1]))
            pos = torch.tensor([n + step])
            logits, last_new = module(embed[[token]], last, pos, cache, None)
            rows_e.append(embed[[token]])
            rows_s.append(last)
            ref_logits, _ = reference_module(t, layout, cfg, torch.cat(rows_e), torch.cat(rows_s),
                                             torch.arange(n + step + 1), target.lm_head.weight)
            torch.testing.assert_close(logits.double(), ref_logits[-1:], rtol=1e-4, atol=1e-4)
            last = last_new


def test_separate_module_and_draft_quant(targets, tmp_path):
    path, _ = targets["deepseek"]
    target = load_model(path, "cpu", torch.float32)
    save_separate(tmp_path / "mod", path, "deepseek", seed=2)
    module = load_draft(tmp_path / "mod", target, "int4")
    assert isinstance(module.model.layers[0].self_attn.q_proj, Int4Linear)
    assert module.lm_head is not None and module.shared == []


@pytest.mark.parametrize("config, message", [
    ({"hidden_size": 32, "intermediate_size": 64}, "has hidden size 32 but the target's is 64"),
    ({"vocab_size": 100}, "predicts over 100 tokens, the target has"),
])
def test_module_that_does_not_fit_is_one_line(targets, tmp_path, config, message):
    path, _ = targets["deepseek"]
    target = load_model(path, "cpu", torch.float32)
    save_separate(tmp_path / "bad", path, "deepseek", config=config)  # tensors of the module's own shape
    with pytest.raises(SpecliteError, match=message) as e:
        load_draft(tmp_path / "bad", target)
    assert "\n" not in str(e.value)


def test_checkpoint_without_a_module_is_one_line(tmp_path):
    save_model(tmp_path, "llama", seed=1, hidden=64, layers=2)
    target = load_model(tmp_path, "cpu", torch.float32)
    with pytest.raises(SpecliteError, match="holds no MTP module .*pass one with --draft DIR$"):
        load_draft(None, target)
