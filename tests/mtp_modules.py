"""Random MTP modules written in the published layouts, and float64 references of them and of MiMo.

Written from the formats' description (DeepSeek-V3: `model.layers.{L}.enorm / hnorm / eh_proj /
shared_head.*` beside the block's tensors, [embedding, state] into eh_proj; MiMo:
`model.mtp_layers.{i}.token_layernorm / hidden_layernorm / input_proj / final_layernorm`,
[state, embedding], the final norm's output both the next state and the lm_head's input; vLLM
zeroes the embedding paired with position 0), not from speclite's code.
"""

import json
import math

import torch
from safetensors.torch import load_file, save_file

from eagle3_heads import _rms, _rope

BLOCK = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj")
MIMO_NAMES = {"enorm": "token_layernorm", "hnorm": "hidden_layernorm", "eh_proj": "input_proj",
              "shared_head.norm": "final_layernorm"}


def module_tensors(cfg: dict, seed=0, own_head=True, scale=4.0, hidden=None) -> dict:
    """DeepSeek-named tensors (no prefix) of one module for a target of config `cfg`."""
    g = torch.Generator().manual_seed(seed)
    h = hidden or cfg["hidden_size"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    d, inter = cfg.get("head_dim") or h // heads, cfg["intermediate_size"]

    def rnd(*shape):
        return torch.randn(*shape, generator=g) / math.sqrt(shape[-1])

    def norm(n):
        return 1 + 0.1 * torch.randn(n, generator=g)

    t = {"enorm.weight": norm(h), "hnorm.weight": norm(h), "eh_proj.weight": rnd(h, 2 * h),
         "self_attn.q_proj.weight": rnd(heads * d, h), "self_attn.k_proj.weight": rnd(kv * d, h),
         "self_attn.v_proj.weight": rnd(kv * d, h), "self_attn.o_proj.weight": rnd(h, heads * d),
         "mlp.gate_proj.weight": rnd(inter, h), "mlp.up_proj.weight": rnd(inter, h),
         "mlp.down_proj.weight": rnd(h, inter),
         "input_layernorm.weight": norm(h), "post_attention_layernorm.weight": norm(h),
         "shared_head.norm.weight": norm(h)}
    if is_qwen2(cfg):
        for p, n in (("q", heads * d), ("k", kv * d), ("v", kv * d)):
            t[f"self_attn.{p}_proj.bias"] = 0.1 * torch.randn(n, generator=g)
    if own_head:
        t["shared_head.head.weight"] = scale * rnd(cfg["vocab_size"], h)
    return t


def is_qwen2(cfg: dict) -> bool:
    return any(a in ("Qwen2ForCausalLM", "MiMoForCausalLM") for a in cfg["architectures"])


def stored(t: dict, layout: str, prefix: str) -> dict:
    """The module's tensors under their checkpoint names."""
    out = {}
    for name, value in t.items():
        stem, _, leaf = name.rpartition(".")
        if layout == "mimo":
            stem = MIMO_NAMES.get(stem, stem)
        out[f"{prefix}{stem}.{leaf}"] = value
    return out


def add_module(model_dir, layout="deepseek", seed=0, own_head=True, scale=4.0) -> dict:
    """Write a random module into a saved target checkpoint (DeepSeek-V3 layout at model.layers.{L},
    or MiMo's at model.mtp_layers.0, which makes the checkpoint a MiMo one); returns its tensors."""
    cfg = json.loads((model_dir / "config.json").read_text())
    if layout == "mimo":
        cfg.update(architectures=["MiMoForCausalLM"], model_type="mimo")
        own_head = False  # MiMo's modules read the target's lm_head
    t = module_tensors(cfg, seed, own_head, scale)
    prefix = f"model.layers.{cfg['num_hidden_layers']}." if layout == "deepseek" else "model.mtp_layers.0."
    weights = load_file(str(model_dir / "model.safetensors"))
    weights.update(stored(t, layout, prefix))
    if layout == "deepseek":
        weights[prefix + "embed_tokens.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(model_dir / "model.safetensors"),
              metadata={"format": "pt"})
    cfg["num_nextn_predict_layers"] = 1
    (model_dir / "config.json").write_text(json.dumps(cfg))
    return t


def save_separate(path, target_dir, layout="deepseek", seed=0, own_head=True, scale=4.0, config=None) -> dict:
    """A module alone in a directory (config.json + tensors), as split off a checkpoint for --draft."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = dict(json.loads((target_dir / "config.json").read_text()), **(config or {}))
    t = module_tensors(cfg, seed, own_head, scale)
    prefix = f"model.layers.{cfg['num_hidden_layers']}." if layout == "deepseek" else "model.mtp_layers.0."
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in stored(t, layout, prefix).items()}, str(path / "model.safetensors"))
    return t


def block(t: dict, prefix: str, x, positions, cfg: dict):
    """float64 pre-norm decoder block (attention + SwiGLU MLP, biases where the tensors have them), causal."""
    n, h = x.shape
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    d = cfg.get("head_dim") or h // heads

    def lin(name, v):
        out = v @ t[f"{prefix}{name}.weight"].double().T
        bias = t.get(f"{prefix}{name}.bias")
        return out if bias is None else out + bias.double()

    def w(name):
        return t[f"{prefix}{name}"].double()

    a = _rms(x, w("input_layernorm.weight"))
    q, k, v = lin("self_attn.q_proj", a).view(n, heads, d), lin("self_attn.k_proj", a).view(n, kv, d), \
        lin("self_attn.v_proj", a).view(n, kv, d)
    theta = cfg.get("rope_theta", 10000.0)
    q, k = _rope(q, positions, theta), _rope(k, positions, theta)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(d)
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril()[None], float("-inf"))
    x = x + lin("self_attn.o_proj", torch.einsum("hij,jhd->ihd", scores.softmax(-1), v).reshape(n, heads * d))
    m = _rms(x, w("post_attention_layernorm.weight"))
    return x + lin("mlp.down_proj", torch.nn.functional.silu(lin("mlp.gate_proj", m)) * lin("mlp.up_proj", m))


def reference_decoder(t: dict, cfg: dict, tokens: list[int]):
    """float64 (logits [T, V], final normed states [T, H]) of a Llama/Qwen2/MiMo checkpoint's decoder."""
    x = t["model.embed_tokens.weight"].double()[torch.tensor(tokens)]
    positions = torch.arange(len(tokens))
    for i in range(cfg["num_hidden_layers"]):
        x = block(t, f"model.layers.{i}.", x, positions, cfg)
    final = _rms(x, t["model.norm.weight"].double())
    head = t.get("lm_head.weight", t["model.embed_tokens.weight"]).double()
    return final @ head.T, final


def reference_module(t: dict, layout: str, cfg: dict, embeds, states, positions, lm_head):
    """float64 (logits, next states) of the module over rows (states[i], embeds[i]) at `positions`, causal.

    `t`: module_tensors' names; `lm_head`: the target's, used when the module has no head."""
    t = {k: v.double() for k, v in t.items()}
    embeds = embeds.double().masked_fill((positions == 0)[:, None], 0)
    e, s = _rms(embeds, t["enorm.weight"]), _rms(states.double(), t["hnorm.weight"])
    x = torch.cat([s, e] if layout == "mimo" else [e, s], -1) @ t["eh_proj.weight"].T
    out = block(t, "", x, positions, cfg)
    normed = _rms(out, t["shared_head.norm.weight"])
    logits = normed @ t.get("shared_head.head.weight", lm_head.double()).T
    return logits, normed if layout == "mimo" else out
