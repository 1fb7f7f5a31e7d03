"""Random drafts of the published shapes (what `speclite bench --synthetic` runs eagle3, dflash, mtp
and medusa with): each loads back through its method's own loader, fits its target and has the
published dimensions; the writers reproduce the shipped trained checkpoints bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from speclite import hub
from speclite.model import load_model
from speclite.model.decoder import ModelArgs
from speclite.speculate.dflash.load import load_drafter
from speclite.speculate.dflash.save import random_drafter, save_drafter, target_layer_ids
from speclite.speculate.eagle3.load import load_head
from speclite.speculate.eagle3.save import random_head, save_head
from speclite.speculate.medusa import load_draft as load_medusa
from speclite.speculate.medusa.save import random_heads, save_heads
from speclite.speculate.mtp import load_draft as load_mtp
from speclite.speculate.mtp.save import random_module, save_module
from speclite.synthetic import build_synthetic, synthetic_config


def small_target(layers: int, vocab: int = 40000) -> dict:
    """Qwen2.5-7B's config with small widths (the shapes follow it; the test stays quick)."""
    return synthetic_config("qwen2.5-7b") | {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
                                             "num_key_value_heads": 2, "num_hidden_layers": layers,
                                             "vocab_size": vocab}


def test_published_dflash_target_layers():
    assert target_layer_ids(36) == [1, 9, 17, 25, 33]  # Qwen3-8B's drafter
    assert target_layer_ids(28) == [1, 7, 13, 19, 25]
    assert target_layer_ids(6) == [1, 2, 3]
    assert target_layer_ids(2) == [1] and target_layer_ids(1) == [0]


@pytest.mark.parametrize("layers,aux", [(8, (2, 4, 5)), (3, (0, 1, 2)), (1, (0, 0, 0))])
def test_random_eagle3_head_loads_with_the_published_shape(tmp_path, layers, aux):
    cfg = small_target(layers)
    random_head(cfg, tmp_path, torch.bfloat16)
    target = ModelArgs.from_hf(cfg)
    head = load_head(tmp_path, target, "cpu", torch.float32)
    assert head.aux_layers == aux
    assert head.lm_head.weight.shape == (32000, 64)  # the published draft vocabulary
    assert head.model.layers[0].mlp.gate_proj.weight.shape == (96, 64)  # the target's MLP width
    assert head.model.fc.weight.shape == (64, 3 * 64)
    assert head.target_ids.unique().numel() == 32000 and int(head.target_ids.max()) < 40000
    weights = load_file(tmp_path / "model.safetensors")
    assert weights["fc.weight"].dtype == torch.bfloat16 and weights["fc.weight"].float().std() > 0.01
    # A target vocabulary below 32000 is the draft vocabulary itself.
    random_head(small_target(layers, vocab=1000), tmp_path / "v", torch.float32)
    assert load_head(tmp_path / "v", ModelArgs.from_hf(small_target(layers, 1000)), "cpu",
                     torch.float32).lm_head.weight.shape == (1000, 64)


def test_random_dflash_drafter_loads_with_the_published_shape(tmp_path):
    cfg = small_target(28)
    random_drafter(cfg, tmp_path, torch.bfloat16)
    draft = load_drafter(tmp_path, ModelArgs.from_hf(cfg), "cpu", torch.float32)
    assert len(draft.model.layers) == 5 and draft.block_size == 16 and draft.mask_token == 39999
    assert draft.target_layers == (1, 7, 13, 19, 25)
    assert draft.model.fc.weight.shape == (64, 5 * 64)
    random_drafter(cfg, tmp_path / "two", torch.bfloat16, layers=2)  # --draft-layers: a quicker drafter
    assert len(load_drafter(tmp_path / "two", ModelArgs.from_hf(cfg), "cpu", torch.float32).model.layers) == 2


def test_random_mtp_module_and_medusa_heads_load_with_the_published_shape(tmp_path):
    cfg = small_target(4, vocab=1000)
    (tmp_path / "target.json").write_text(json.dumps(cfg))
    target = load_model(build_synthetic(str(tmp_path / "target.json"), tmp_path / "target", dtype=torch.float32), "cpu",
                        torch.float32)
    random_module(cfg, tmp_path / "mtp", torch.bfloat16)
    module = load_mtp(tmp_path / "mtp", target)
    assert module.model.layers[0].mlp.gate_proj.weight.shape == (96, 64)  # one block of the target's shape
    assert module.model.layers[0].eh_proj.weight.shape == (64, 128) and module.lm_head is None
    random_heads(cfg, tmp_path / "medusa", torch.bfloat16)
    heads = load_medusa(tmp_path / "medusa", target)
    assert len(heads) == 5 and all(h.lm_head.weight.shape == (1000, 64) for h in heads.heads)  # own heads
    assert all(len(h.layers) == 1 and h.layers[0].bias is not None for h in heads.heads)


def test_the_writers_reproduce_the_shipped_trained_drafts(tmp_path):
    target = ModelArgs.from_hf(json.loads((hub.resolve("tiny-code") / "config.json").read_text()))
    model = load_model(hub.resolve("tiny-code"), "cpu", torch.bfloat16)
    for name in ("tiny-code-eagle3", "tiny-code-dflash", "tiny-code-mtp", "tiny-code-medusa"):
        shipped = hub.resolve(name)
        config = json.loads((shipped / "config.json").read_text())
        out = tmp_path / name
        if name.endswith("eagle3"):
            head = load_head(shipped, target, "cpu", torch.bfloat16)
            save_head(head.state_dict(), head.target_ids, config, out)
        elif name.endswith("dflash"):
            save_drafter(dict(load_drafter(shipped, target, "cpu", torch.bfloat16).named_parameters()), config, out)
        elif name.endswith("mtp"):
            save_module(load_mtp(shipped, model).state_dict(), config, out)
        else:
            save_heads(load_medusa(shipped, model).state_dict(), config, out)
        a, b = load_file(shipped / "model.safetensors"), load_file(out / "model.safetensors")
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
        assert json.loads((out / "config.json").read_text()) == config


def test_a_synthetic_model_is_written_a_shard_at_a_time(tmp_path, monkeypatch):
    """Drawn and written shard by shard (a 7B model drawn whole and joined by save_file took a 24 GB
    machine down): shards of 1 MiB give a sharded checkpoint with the same numbers as one file."""
    import functools

    from speclite import synthetic
    from speclite.model.loader import read_tensors

    whole = build_synthetic("qwen2.5-0.5b", tmp_path / "whole", layers=1)
    monkeypatch.setattr(synthetic, "ShardWriter", functools.partial(synthetic.ShardWriter, shard_bytes=2**20))
    sharded = build_synthetic("qwen2.5-0.5b", tmp_path / "sharded", layers=1)
    assert len(list(sharded.glob("model-*-of-*.safetensors"))) > 2 and (sharded / "model.safetensors.index.json").exists()
    a, b = read_tensors(whole, lambda n: True), read_tensors(sharded, lambda n: True)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert load_model(sharded, "cpu", torch.float32).args.num_layers == 1
