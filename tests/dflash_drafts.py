"""Random DFlash drafters saved in the published layout (z-lab/*-DFlash*), and a float64 reference of a block.

Written from the format's description (a Qwen3 config plus `dflash_config`; tensors `fc`,
`hidden_norm`, `layers.N.*` with q/k norms, `norm`; no embedding or head), not from speclite's code.
"""

import json
import math

import torch
from safetensors.torch import save_file

from eagle3_heads import _rms, _rope

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def save_drafter(path, hidden, vocab, target_layer_ids, mask_token, layers=2, heads=4, kv_heads=2, head_dim=16,
                 block_size=16, seed=0, extra_config=None, dflash_config=None):
    """A random drafter written to `path`; returns its tensors (checkpoint names)."""
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    inter = 2 * hidden

    def rnd(*shape):
        return torch.randn(*shape, generator=g) / math.sqrt(shape[-1])

    def norm(n):
        return 1 + 0.1 * torch.randn(n, generator=g)

    t = {"fc.weight": rnd(hidden, len(target_layer_ids) * hidden), "hidden_norm.weight": norm(hidden),
         "norm.weight": norm(hidden)}
    shapes = {"self_attn.q_proj": (heads * head_dim, hidden), "self_attn.k_proj": (kv_heads * head_dim, hidden),
              "self_attn.v_proj": (kv_heads * head_dim, hidden), "self_attn.o_proj": (hidden, heads * head_dim),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    for i in range(layers):
        for name in LINEARS:
            t[f"layers.{i}.{name}.weight"] = rnd(*shapes[name])
        for name, n in (("input_layernorm", hidden), ("post_attention_layernorm", hidden),
                        ("self_attn.q_norm", head_dim), ("self_attn.k_norm", head_dim)):
            t[f"layers.{i}.{name}.weight"] = norm(n)
    cfg = dict(architectures=["DFlashDraftModel"], model_type="qwen3", hidden_size=hidden, intermediate_size=inter,
               num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
               vocab_size=vocab, rms_norm_eps=1e-6, max_position_embeddings=512, rope_theta=10000.0,
               attention_bias=False, hidden_act="silu", tie_word_embeddings=False,
               layer_types=["full_attention"] * layers, num_target_layers=None,
               dflash_config=dict(dict(target_layer_ids=list(target_layer_ids), block_size=block_size,
                                       mask_token_id=mask_token), **(dflash_config or {})))
    cfg.update(extra_config or {})
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in t.items()}, str(path / "model.safetensors"))
    return t


def reference_block(t, states, embeds, lm_head, heads=4, kv_heads=2, head_dim=16, eps=1e-6):
    """float64 logits [B - 1, V] of a block: context rows from `states` [C, n * H] (positions 0..C-1,
    the concatenated target layer outputs), block `embeds` [B, H] at positions C.., every query
    seeing every context and block row."""
    t = {k: v.double() for k, v in t.items()}
    c, b = states.shape[0], embeds.shape[0]
    ctx = _rms(states.double() @ t["fc.weight"].T, t["hidden_norm.weight"], eps)
    x = embeds.double()
    pos = torch.arange(c + b)
    layers = 1 + max(int(k.split(".")[1]) for k in t if k.startswith("layers."))
    for i in range(layers):
        w = {name: t[f"layers.{i}.{name}.weight"] for name in (*LINEARS, "input_layernorm", "post_attention_layernorm",
                                                              "self_attn.q_norm", "self_attn.k_norm")}
        h = _rms(x, w["input_layernorm"], eps)
        both = torch.cat([ctx, h])
        q = _rms((h @ w["self_attn.q_proj"].T).view(b, heads, head_dim), w["self_attn.q_norm"], eps)
        k = _rms((both @ w["self_attn.k_proj"].T).view(c + b, kv_heads, head_dim), w["self_attn.k_norm"], eps)
        v = (both @ w["self_attn.v_proj"].T).view(c + b, kv_heads, head_dim)
        q, k = _rope(q, pos[c:]), _rope(k, pos)
        k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
        attn = (torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(head_dim)).softmax(-1)
        x = x + torch.einsum("hij,jhd->ihd", attn, v).reshape(b, -1) @ w["self_attn.o_proj"].T
        m = _rms(x, w["post_attention_layernorm"], eps)
        x = x + (torch.nn.functional.silu(m @ w["mlp.gate_proj"].T) * (m @ w["mlp.up_proj"].T)) @ w["mlp.down_proj"].T
    return _rms(x, t["norm.weight"], eps)[1:] @ lm_head.double().T
