"""Our decoder's logits against transformers' own implementation of each family."""

import subprocess
import sys

import pytest
import torch
from conftest import CONFIGS, save_model
from transformers import AutoModelForCausalLM

from speclite.errors import SpecliteError
from speclite.model import load_model

ROPE_VARIANTS = {
    "llama3": ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "yarn": ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}),
    "linear": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
}


def reference_logits(model_dir, ids):
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(ids[None]).logits[0]


def check_against_reference(model_dir, seed=0):
    torch.manual_seed(seed)
    ids = torch.randint(0, 300, (40,))
    expected = reference_logits(model_dir, ids)
    model = load_model(model_dir, device="cpu")
    with torch.no_grad():
        cache = model.new_cache(64)
        prefill = model(ids[:25], cache)  # prefill
        steps = torch.cat([model(ids[i : i + 1], cache) for i in range(25, 30)])  # one-token decode
        cache.rollback(27)  # drop 3 tokens, then a multi-token (verification-shaped) forward
        verify = model(ids[27:40], cache)
    assert (prefill - expected[:25]).abs().max() <= 1e-4
    assert (steps - expected[25:30]).abs().max() <= 1e-4
    assert (verify - expected[27:40]).abs().max() <= 1e-4
    assert cache.length == 40


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_logits_match_transformers(model_dirs, family):
    check_against_reference(model_dirs[family])


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_torch_layer_ops_match_transformers_too(model_dirs, family, monkeypatch):
    """The torch path (GPUs, CPUs without AVX2) where this machine takes the C++ layer ops."""
    from speclite.kernels import cpu_layer_ops

    monkeypatch.setattr(cpu_layer_ops, "takes", lambda x: False)
    check_against_reference(model_dirs[family])


@pytest.mark.parametrize("variant", sorted(ROPE_VARIANTS))
def test_rope_scaling_matches_transformers(tmp_path, tokenizer, variant):
    family, overrides = ROPE_VARIANTS[variant]
    save_model(tmp_path, family, tokenizer=tokenizer, seed=3, **overrides)
    check_against_reference(tmp_path, seed=1)


def test_sharded_checkpoint_loads(tmp_path, tokenizer):
    model = save_model(tmp_path / "full", "qwen2", tokenizer=tokenizer, seed=4)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    check_against_reference(tmp_path / "sharded")


def test_unsupported_architecture_is_named(tmp_path, model_dirs):
    import json
    import shutil

    shutil.copytree(model_dirs["llama"], tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecliteError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        load_model(tmp_path / "m")


def test_truncated_safetensors_is_a_clear_error(tmp_path, model_dirs):
    import shutil

    shutil.copytree(model_dirs["qwen2"], tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(SpecliteError, match="corrupt or truncated"):
        load_model(tmp_path / "m")


def test_quantized_tensor_where_speclite_expects_dense_is_refused(tmp_path, model_dirs):
    """An fp8 lm_head (say) without its scales must not load as silently wrong weights."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dirs["llama"], tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.float8_e4m3fn)
    save_file(tensors, str(weights))
    with pytest.raises(SpecliteError, match="'model.norm.weight' is stored quantized"):
        load_model(tmp_path / "m")


def test_context_overflow_is_a_clear_error(model_dirs):
    model = load_model(model_dirs["qwen2"])
    cache = model.new_cache(8)
    with pytest.raises(SpecliteError, match="exceeds the context"):
        model(torch.arange(9), cache)


@pytest.mark.parametrize("shape", [(1, 5), (5, 1), ()])
def test_tokens_not_one_sequence_are_a_clear_error(model_dirs, shape):
    # A batch dimension once reached the C attention as a mis-shaped row and crashed the process.
    model = load_model(model_dirs["qwen2"])
    cache = model.new_cache(16)
    with pytest.raises(SpecliteError, match=r"one sequence of ids \[T\]"):
        model(torch.zeros(shape, dtype=torch.long), cache)
    assert cache.length == 0


def test_static_forward_equals_dynamic(model_dirs):
    """The fixed-shape step (what CUDA graphs capture) gives the dynamic forward's logits."""
    from speclite.model.static import StaticDecoder

    model = load_model(model_dirs["mistral"])
    torch.manual_seed(2)
    ids = torch.randint(0, 300, (30,))
    with torch.no_grad():
        dynamic_cache, static_cache = model.new_cache(48), model.new_cache(48)
        static = StaticDecoder(model, static_cache, max_tokens=8)
        expected = torch.cat([model(ids[:20], dynamic_cache), model(ids[20:21], dynamic_cache),
                              model(ids[21:26], dynamic_cache)])
        got = torch.cat([static(ids[:20], static_cache), static(ids[20:21], static_cache),
                         static(ids[21:26], static_cache)])
        assert static_cache.length == 26
        static_cache.rollback(22)
        dynamic_cache.rollback(22)
        again = static(ids[22:26], static_cache)
        assert torch.allclose(again, model(ids[22:26], dynamic_cache), atol=1e-4)
    assert (got - expected).abs().max() <= 1e-4


def test_gradients_flow_through_the_decoder_on_the_cpu(model_dirs):
    """The trainers in scripts/ train heads from the decoder's modules: where a gradient is needed the
    CPU kernels (no backward) give way to torch's ops, with the same forward to rounding."""
    model = load_model(model_dirs["qwen2"], device="cpu")
    ids = torch.randint(0, 300, (12,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(ids, model.new_cache(16))
    layer = model.model.layers[1]
    for p in layer.parameters():
        p.requires_grad_(True)
    logits = model(ids, model.new_cache(16))
    logits.logsumexp(-1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters() if p.dim() > 1)
    assert (logits.detach() - expected).abs().max() <= 1e-4


def test_static_steps_read_the_cache_up_to_their_span(model_dirs, monkeypatch):
    """A fixed-shape step attends the cache's first span keys (the next power of two above the
    sequence, at least MIN_SPAN, at most the cache): the dynamic forward's logits, while keys past
    the sequence are never read (NaNs in the unwritten slots change nothing)."""
    import speclite.model.static as static_mod

    monkeypatch.setattr(static_mod, "MIN_SPAN", 8)
    model = load_model(model_dirs["qwen2"])
    spans = []
    forward_static = model.forward_static
    monkeypatch.setattr(model, "forward_static", lambda *a: spans.append(a[-1]) or forward_static(*a))
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        dynamic_cache, static_cache = model.new_cache(48), model.new_cache(48)
        for layer_k, layer_v in static_cache.layers:
            layer_k.fill_(float("nan"))
            layer_v.fill_(float("nan"))
        static = static_mod.StaticDecoder(model, static_cache, max_tokens=8)
        expected = torch.cat([model(ids[:6], dynamic_cache)] + [model(ids[i:i + 1], dynamic_cache) for i in range(6, 14)]
                             + [model(ids[14:19], dynamic_cache), model(ids[19:40], dynamic_cache)])
        got = torch.cat([static(ids[:6], static_cache)] + [static(ids[i:i + 1], static_cache) for i in range(6, 14)]
                        + [static(ids[14:19], static_cache), static(ids[19:40], static_cache)])
    assert spans == [8, 8, 8, 16, 16, 16, 16, 16, 16, 32]  # 40 tokens at once: the dynamic forward
    assert got.isfinite().all() and (got - expected).abs().max() <= 1e-4


def test_loading_a_model_leaves_torch_compiler_unimported(model_dirs):
    # Every CLI command starts by loading a model: torch._dynamo's import alone is about 1.5 s of it.
    # A fresh process, since the test session itself may have imported it.
    code = ("import sys; from speclite.model import load_model; "
            f"load_model({str(model_dirs['qwen2'])!r}, device='cpu'); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
