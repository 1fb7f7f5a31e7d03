"""Random Medusa heads saved in the published layouts, and a float64 reference of their forward.

Written from the formats' description, not from speclite's code:
- FasterDecoding/Medusa: config.json {medusa_num_heads, medusa_num_layers}, tensors `{i}.{j}.linear.weight/bias`
  (block j of head i) and `{i}.{num_layers}.weight` (its lm_head) in medusa_lm_head.safetensors or .pt;
- vLLM: config.json {model_type: medusa, num_heads, num_hidden_layers, hidden_size, vocab_size}, tensors
  `blocks.{i}.layers.{j}.weight/bias` and `lm_heads.{i}.weight` in model.safetensors;
- vLLM with `original_lm_head` and only the blocks saved ("vllm-target-head"): every head uses the
  target's own lm_head, `base`.
"""

import json
import math

import torch
from safetensors.torch import save_file

LAYOUTS = ("medusa", "medusa-pt", "vllm")


def head_tensors(hidden, vocab, heads=3, layers=1, seed=0, base=None, noise=0.5):
    """Tensors with Medusa's own names. Each lm_head is `base` (e.g. the target's lm_head, as Medusa
    initialises them) plus noise, or random; block weights are random and small, biases random."""
    g = torch.Generator().manual_seed(seed)
    t = {}
    for i in range(heads):
        for j in range(layers):
            t[f"{i}.{j}.linear.weight"] = torch.randn(hidden, hidden, generator=g) / math.sqrt(hidden)
            t[f"{i}.{j}.linear.bias"] = 0.1 * torch.randn(hidden, generator=g)
        lm = torch.randn(vocab, hidden, generator=g) / math.sqrt(hidden)
        t[f"{i}.{layers}.weight"] = lm if base is None else base.detach().float() + noise * base.std() * lm
    return t


def to_vllm(t, heads, layers):
    out = {}
    for i in range(heads):
        for j in range(layers):
            out[f"blocks.{i}.layers.{j}.weight"] = t[f"{i}.{j}.linear.weight"]
            out[f"blocks.{i}.layers.{j}.bias"] = t[f"{i}.{j}.linear.bias"]
        out[f"lm_heads.{i}.weight"] = t[f"{i}.{layers}.weight"]
    return out


def save_heads(path, layout, hidden, vocab, heads=3, layers=1, seed=0, base=None, extra_config=None):
    """Random heads written in `layout` (one of LAYOUTS); returns their tensors under Medusa's names."""
    path.mkdir(parents=True, exist_ok=True)
    t = head_tensors(hidden, vocab, heads, layers, seed, base)
    if layout == "vllm-target-head":
        t.update({f"{i}.{layers}.weight": base.detach().float() for i in range(heads)})
        cfg = dict(model_type="medusa", num_heads=heads, num_hidden_layers=layers, hidden_size=hidden,
                   vocab_size=vocab, medusa_fc_bias=True, original_lm_head=True)
        blocks = {k: v.contiguous() for k, v in to_vllm(t, heads, layers).items() if k.startswith("blocks.")}
        save_file(blocks, str(path / "model.safetensors"))
    elif layout == "vllm":
        cfg = dict(model_type="medusa", architectures=["MedusaModel"], num_heads=heads, num_hidden_layers=layers,
                   hidden_size=hidden, vocab_size=vocab, truncated_vocab_size=vocab, medusa_fc_bias=True)
        save_file({k: v.contiguous() for k, v in to_vllm(t, heads, layers).items()}, str(path / "model.safetensors"))
    else:
        cfg = dict(medusa_num_heads=heads, medusa_num_layers=layers, base_model_name_or_path="target")
        if layout == "medusa-pt":
            torch.save({k: v.half() for k, v in t.items()}, path / "medusa_lm_head.pt")
            t = {k: v.half().float() for k, v in t.items()}  # what the file holds
        else:
            save_file({k: v.contiguous() for k, v in t.items()}, str(path / "medusa_lm_head.safetensors"))
    cfg.update(extra_config or {})
    (path / "config.json").write_text(json.dumps(cfg))
    return t


def reference_logits(t, state, heads, layers):
    """float64 logits [heads, V] of every head for one final state [H]."""
    out = []
    for i in range(heads):
        x = state.double()
        for j in range(layers):
            x = x + torch.nn.functional.silu(x @ t[f"{i}.{j}.linear.weight"].double().T
                                             + t[f"{i}.{j}.linear.bias"].double())
        out.append(x @ t[f"{i}.{layers}.weight"].double().T)
    return torch.stack(out)
