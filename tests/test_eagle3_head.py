"""EAGLE-3 heads load from both published layouts and compute what the format says (float64 reference)."""

import json

import pytest
import torch

from eagle3_heads import reference_fuse, reference_head, save_head
from speclite.errors import SpecliteError
from speclite.model.decoder import ModelArgs
from speclite.speculate.eagle3.load import load_head

HIDDEN, VOCAB, LAYERS = 48, 160, 6


def target_args(hidden=HIDDEN, vocab=VOCAB, layers=LAYERS):
    return ModelArgs.from_hf(dict(architectures=["LlamaForCausalLM"], vocab_size=vocab, hidden_size=hidden,
                                  intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                                  num_key_value_heads=2))


@pytest.mark.parametrize("layout", ["specforge", "speculators"])
@pytest.mark.parametrize("draft_vocab,norm_before_residual", [(VOCAB, False), (100, False), (100, True)])
def test_forward_matches_reference(tmp_path, layout, draft_vocab, norm_before_residual):
    tensors = save_head(tmp_path, layout, HIDDEN, VOCAB, draft_vocab, norm_before_residual=norm_before_residual, seed=3)
    head = load_head(tmp_path, target_args(), torch.device("cpu"), torch.float32)
    torch.manual_seed(0)
    n = 9
    target_states = torch.randn(n, 3 * HIDDEN)
    embeds = torch.randn(n, HIDDEN)
    fused = head.fuse(target_states)
    torch.testing.assert_close(fused.double(), reference_fuse(tensors, target_states), rtol=1e-4, atol=1e-4)
    # Through the cache: 6 rows at once, then 3 single rows (decode steps).
    cache = head.new_cache(32)
    logits, states = [], []
    for lo, hi in [(0, 6), (6, 7), (7, 8), (8, 9)]:
        lg, st = head(embeds[lo:hi], fused[lo:hi], torch.arange(lo, hi), cache, None)
        logits.append(head.to_target(lg, VOCAB))
        states.append(st)
    ref_logits, ref_states = reference_head(tensors, embeds, fused.detach(), torch.arange(n),
                                            torch.ones(n, n, dtype=torch.bool).tril(),
                                            norm_before_residual=norm_before_residual, vocab=VOCAB)
    got = torch.cat(logits).double()
    assert torch.equal(torch.isinf(got), torch.isinf(ref_logits))
    finite = torch.isfinite(ref_logits)
    torch.testing.assert_close(got[finite], ref_logits[finite], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.cat(states).double(), ref_states, rtol=1e-4, atol=1e-4)
    assert (torch.isfinite(ref_logits).sum(-1) == draft_vocab).all()


def test_tree_mask_rows_see_their_ancestors_only(tmp_path):
    tensors = save_head(tmp_path, "specforge", HIDDEN, VOCAB, seed=4)
    head = load_head(tmp_path, target_args(), torch.device("cpu"), torch.float32)
    torch.manual_seed(1)
    embeds, states = torch.randn(7, HIDDEN), torch.randn(7, HIDDEN)
    # 4 committed rows, then a tree: rows 4 and 5 are siblings at depth 1, row 6 is row 5's child.
    positions = torch.tensor([0, 1, 2, 3, 4, 4, 5])
    attend = torch.ones(7, 7, dtype=torch.bool).tril()
    attend[5, 4] = attend[6, 4] = False
    cache = head.new_cache(16)
    head(embeds[:4], states[:4], positions[:4], cache, None)
    lg, st = head(embeds[4:], states[4:], positions[4:], cache, attend[4:])
    ref_logits, ref_states = reference_head(tensors, embeds, states, positions, attend)
    torch.testing.assert_close(lg.double(), ref_logits[4:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(st.double(), ref_states[4:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout,ids,expected", [
    ("speculators", [1, 3, 4], (1, 3, 4)),  # vLLM's convention: inputs of these layers
    ("specforge", [1, 2, 3], (2, 3, 4)),  # SpecForge's outputs-of-layers convention (first id 1)
    ("specforge", [2, 3, 4], (2, 3, 4)),
    ("specforge", None, (2, LAYERS // 2, LAYERS - 3)),
])
def test_aux_layers(tmp_path, layout, ids, expected):
    save_head(tmp_path, layout, HIDDEN, VOCAB, aux_ids=ids)
    assert load_head(tmp_path, target_args(), torch.device("cpu"), torch.float32).aux_layers == expected


@pytest.mark.parametrize("kwargs,target,message", [
    (dict(), dict(hidden=64), "hidden size 48"),
    (dict(target_hidden=64), dict(), "target states 64"),
    (dict(), dict(vocab=170), "vocabulary of 160"),
    (dict(aux_ids=[2, 3, 6]), dict(), "layers [2, 3, 6]"),
    (dict(aux_ids=[2, 3]), dict(), "three of them"),
    (dict(), dict(layers=2), "target has 2 layers"),
    (dict(extra_config={"architectures": ["LlamaForCausalLM"]}), dict(), "not an EAGLE-3 head"),
])
def test_misfit_head_is_one_line_error(tmp_path, kwargs, target, message):
    save_head(tmp_path, "specforge", HIDDEN, VOCAB, **kwargs)
    with pytest.raises(SpecliteError) as e:
        load_head(tmp_path, target_args(**target), torch.device("cpu"), torch.float32)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_d2t_and_multilayer_are_errors(tmp_path):
    from safetensors.torch import load_file, save_file

    save_head(tmp_path / "a", "speculators", HIDDEN, VOCAB, draft_vocab=100)
    t = load_file(str(tmp_path / "a" / "model.safetensors"))
    t["d2t"] = t["d2t"] + 200
    save_file(t, str(tmp_path / "a" / "model.safetensors"))
    with pytest.raises(SpecliteError, match="d2t maps draft ids outside"):
        load_head(tmp_path / "a", target_args(), torch.device("cpu"), torch.float32)
    save_head(tmp_path / "b", "speculators", HIDDEN, VOCAB)
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    cfg["transformer_layer_config"]["num_hidden_layers"] = 2
    (tmp_path / "b" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecliteError, match="one-layer"):
        load_head(tmp_path / "b", target_args(), torch.device("cpu"), torch.float32)
