"""Medusa heads load from both published layouts into the same heads, match a float64 reference, and
propose the same drafts; trees, options and misfit heads."""

import json

import pytest
import torch
from safetensors.torch import save_file

from conftest import save_model
from medusa_heads import LAYOUTS, head_tensors, reference_logits, save_heads, to_vllm
from speclite.errors import SpecliteError
from speclite.model.loader import load_model
from speclite.model.step import Step
from speclite.sampling import SamplingParams
from speclite.speculate import BuildContext, RequestContext, build_proposer, method_options
from speclite.speculate.medusa import MedusaProposer, load_draft, load_heads
from speclite.speculate.medusa.tree import default_tree, parse_tree

HIDDEN = 48


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("medusa-target")
    save_model(path, "llama", seed=5, hidden=HIDDEN, layers=2)
    return load_model(path, "cpu", torch.float32)


def load(path, target):
    return load_heads(path, target.args, torch.device("cpu"), torch.float32)


def drafts(heads, state, k, **kw):
    """(tokens, parents) proposed right after a prefill whose last row had final state `state`."""
    proposer = MedusaProposer(heads, **kw)
    proposer.begin([1, 2], RequestContext(SamplingParams(), torch.Generator(), torch.device("cpu"),
                                          prompt_states=Step(torch.empty(0, 1), final=state[None])))
    p = proposer.propose(k)
    return p.tokens, p.parents


@pytest.mark.parametrize("layers", [1, 2])
def test_layouts_load_to_the_reference_and_propose_alike(tmp_path, target, layers):
    vocab = target.args.vocab_size
    state = torch.randn(HIDDEN, generator=torch.Generator().manual_seed(1))
    proposals = {}
    for layout in LAYOUTS:
        t = save_heads(tmp_path / layout, layout, HIDDEN, vocab, heads=4, layers=layers, seed=3)
        heads = load(tmp_path / layout, target)
        ref = reference_logits(t, state, 4, layers)
        torch.testing.assert_close(heads(state).double(), ref, atol=1e-4, rtol=1e-4)
        top = ref.topk(3, dim=-1).indices.tolist()
        tokens, parents = drafts(heads, state, 4)
        assert tokens == [row[0] for row in top] and parents == [-1, 0, 1, 2]  # head i's best, chained
        tree = parse_tree("[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]")
        tokens, parents = drafts(heads, state, 7, tree=tree)
        assert tokens == [top[0][0], top[0][1], top[0][2], top[1][0], top[1][1], top[1][0], top[2][0]]
        assert parents == [-1, -1, -1, 0, 0, 1, 3]
        proposals[layout] = [drafts(heads, state, k, topk=topk) for k in (1, 3, 9) for topk in (1, 2, 3)]
    assert proposals["medusa"] == proposals["vllm"]  # the same float32 weights (the .pt holds float16)


def test_medusa2_config_and_vllm_variants(tmp_path, target):
    """A Medusa-2 config carries the base model's keys too; vLLM heads may have no bias, or one shared lm_head."""
    vocab = target.args.vocab_size
    state = torch.randn(HIDDEN)
    t = save_heads(tmp_path / "m2", "medusa", HIDDEN, vocab, heads=2, layers=1, seed=4,
                   extra_config={"model_type": "llama", "num_hidden_layers": 32, "hidden_size": HIDDEN})
    torch.testing.assert_close(load(tmp_path / "m2", target)(state).double(), reference_logits(t, state, 2, 1),
                               atol=1e-4, rtol=1e-4)

    plain = to_vllm(t, 2, 1)
    cfg = {"model_type": "medusa", "num_heads": 2, "num_hidden_layers": 1, "hidden_size": HIDDEN, "vocab_size": vocab}
    (tmp_path / "nobias").mkdir()
    (tmp_path / "nobias" / "config.json").write_text(json.dumps(cfg))
    save_file({k: v for k, v in plain.items() if not k.endswith("bias")}, str(tmp_path / "nobias" / "model.safetensors"))
    zero = {k: torch.zeros_like(v) if k.endswith("bias") else v for k, v in t.items()}
    torch.testing.assert_close(load(tmp_path / "nobias", target)(state).double(),
                               reference_logits(zero, state, 2, 1), atol=1e-4, rtol=1e-4)

    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "config.json").write_text(json.dumps(dict(cfg, original_lm_head=True)))
    save_file({k: v for k, v in plain.items() if k != "lm_heads.1.weight"}, str(tmp_path / "shared" / "model.safetensors"))
    shared = dict(t, **{"1.1.weight": t["0.1.weight"]})
    heads = load(tmp_path / "shared", target)
    torch.testing.assert_close(heads(state).double(), reference_logits(shared, state, 2, 1), atol=1e-4, rtol=1e-4)
    assert heads.heads[1].lm_head.weight is heads.heads[0].lm_head.weight


def test_heads_without_an_lm_head_use_the_targets(tmp_path, target):
    """vLLM's original_lm_head with only the blocks saved: the target's lm_head, not a copy; with
    --draft-quant, one copy of it quantized alike that every head shares (the target keeps its own)."""
    from speclite.model.decoder import Linear
    from speclite.quant.quantize import quantize_lm_head

    state = torch.randn(HIDDEN, generator=torch.Generator().manual_seed(2))
    t = save_heads(tmp_path, "vllm-target-head", HIDDEN, target.args.vocab_size, heads=3, layers=2, seed=6,
                   base=target.lm_head.weight)
    weight = target.lm_head.weight.clone()
    heads = load_draft(tmp_path, target)
    assert heads.shared == [target.lm_head] and not any("lm_head" in n for n, _ in heads.named_parameters())
    torch.testing.assert_close(heads(state).double(), reference_logits(t, state, 3, 2), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(heads(state, 2).double(), reference_logits(t, state, 2, 2), atol=1e-4, rtol=1e-4)
    for quant in ("w8a8", "int4"):
        quantized = load_draft(tmp_path, target, quant)
        expected = torch.nn.Module()
        expected.lm_head = Linear.holding(weight)
        quantize_lm_head(expected, quant)
        assert quantized.shared == [quantized.rows] and type(quantized.rows) is type(expected.lm_head) is not Linear
        assert any(m is quantized.rows for m in quantized.modules())  # counted in the heads' memory
        with torch.inference_mode():
            blocks = torch.stack([head.blocks(state) for head in quantized.heads])
            assert torch.equal(quantized(state), expected.lm_head(blocks))
    assert type(target.lm_head) is Linear and torch.equal(target.lm_head.weight, weight)


@pytest.mark.parametrize("layers, hidden, message", [
    (1, 32, f"has blocks of shape (32, 32) but the target's hidden size is {HIDDEN}"),
    (0, HIDDEN, "has neither residual blocks nor an lm_head of its own"),
])
def test_misfit_blocks_without_an_lm_head_are_one_line_errors(tmp_path, target, layers, hidden, message):
    save_heads(tmp_path, "vllm-target-head", hidden, target.args.vocab_size, heads=2, layers=layers,
               base=torch.randn(target.args.vocab_size, hidden))
    with pytest.raises(SpecliteError) as e:
        load(tmp_path, target)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("change, message", [
    ({"hidden": 32}, f"has hidden size 32 but the target's is {HIDDEN}"),
    ({"layout": "vllm", "hidden": 32}, f"has hidden size 32 but the target's is {HIDDEN}"),
    ({"vocab": 300}, "predicts over 300 tokens, the target's vocabulary has"),
    ({"layout": "vllm", "vocab": 300}, "predicts over 300 tokens"),
    ({"extra_config": {"medusa_num_heads": 0}}, "positive number of heads"),
    ({"extra_config": {"medusa_num_layers": 2}}, "unexpected tensor '0.1.weight'"),
    ({"layout": "vllm", "extra_config": {"model_type": "llama"}}, "is not a Medusa head"),
    ({"layout": "vllm", "extra_config": {"truncated_vocab_size": 100}}, "truncated vocabulary"),
])
def test_misfit_head_is_one_line_error(tmp_path, target, change, message):
    kw = dict(dict(layout="medusa", hidden=HIDDEN, vocab=target.args.vocab_size), **change)
    save_heads(tmp_path, kw.pop("layout"), kw.pop("hidden"), kw.pop("vocab"), heads=2, **kw)
    with pytest.raises(SpecliteError) as e:
        load(tmp_path, target)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_default_tree_and_parsed_tree():
    tree = default_tree(2, 3, 12)
    assert tree[:4] == [(0,), (0, 0), (0, 0, 0), (1,)]  # the argmax chain first, then branches near the root
    assert len(set(tree)) == 12 and all(len(p) == 1 or p[:-1] in tree[: tree.index(p)] for p in tree)
    assert default_tree(1, 3, 10) == [(0,), (0, 0), (0, 0, 0)]
    assert parse_tree("[[0, 1], [1], [0]]") == [(0,), (1,), (0, 1)]  # shortest first, as Medusa sorts


@pytest.mark.parametrize("options, message", [
    ({"medusa_topk": 0}, "--medusa-topk must be at least 1"),
    ({"medusa_tree": "[[0], [0, 1"}, "is not valid JSON"),
    ({"medusa_tree": "[[0], [-1]]"}, "non-empty list of paths"),
    ({"medusa_tree": "[[0], [1, 0, 0]]"}, "path [1, 0, 0] has no parent [1, 0]"),
    ({"medusa_tree": "no/such/file.json"}, "neither a JSON list of paths nor a file"),
    ({"medusa_tree": "[[0]]", "medusa_topk": 2}, "leave --medusa-topk out"),
])
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(SpecliteError) as e:
        method_options("medusa", options)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_tree_file_and_a_tree_deeper_than_the_heads(tmp_path, target):
    save_heads(tmp_path / "h", "vllm", HIDDEN, target.args.vocab_size, heads=2)
    (tmp_path / "tree.json").write_text("[[0], [0, 0], [0, 0, 0]]")
    options = method_options("medusa", {"medusa_tree": str(tmp_path / "tree.json")})
    with pytest.raises(SpecliteError, match="3 levels deep but .* has 2 heads"):
        build_proposer("medusa", BuildContext(options, target, None, 64, tmp_path / "h"))
    options = method_options("medusa", {"medusa_tree": "[[0], [1], [0, 0]]"})
    assert isinstance(build_proposer("medusa", BuildContext(options, target, None, 64, tmp_path / "h")),
                      MedusaProposer)
