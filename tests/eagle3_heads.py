"""Random EAGLE-3 heads saved in the published layouts, and a float64 reference of their forward.

Written from the formats' description (SpecForge / SafeAILab: `midlayer.*`, Llama config at the
top level; vLLM speculators: `layers.0.*`, `transformer_layer_config`), not from speclite's code.
"""

import json
import math

import torch
from safetensors.torch import save_file

LAYER_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def head_tensors(hidden, vocab, draft_vocab, heads=4, kv_heads=2, inter=None, seed=0, target_hidden=None, scale=1.0):
    """Checkpoint tensors with SpecForge names (midlayer.*); d2t maps draft ids to a random subset."""
    g = torch.Generator().manual_seed(seed)
    th = target_hidden or hidden
    d, inter = hidden // heads, inter or 2 * hidden + 16

    def rnd(*shape, std=None):
        return torch.randn(*shape, generator=g) * (std or 1 / math.sqrt(shape[-1]))

    t = {
        "fc.weight": rnd(hidden, 3 * th),
        "midlayer.self_attn.q_proj.weight": rnd(heads * d, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rnd(kv_heads * d, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rnd(kv_heads * d, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rnd(hidden, heads * d),
        "midlayer.mlp.gate_proj.weight": rnd(inter, hidden),
        "midlayer.mlp.up_proj.weight": rnd(inter, hidden),
        "midlayer.mlp.down_proj.weight": rnd(hidden, inter),
        "midlayer.input_layernorm.weight": 1 + 0.1 * rnd(hidden, std=1),
        "midlayer.hidden_norm.weight": 1 + 0.1 * rnd(hidden, std=1),
        "midlayer.post_attention_layernorm.weight": 1 + 0.1 * rnd(hidden, std=1),
        "norm.weight": 1 + 0.1 * rnd(hidden, std=1),
        "lm_head.weight": scale * rnd(draft_vocab, hidden),
    }
    if draft_vocab != vocab:
        target_ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
        t["d2t"] = target_ids - torch.arange(draft_vocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[target_ids] = True
        t["t2d"] = t2d
    return t


def save_head(path, layout, hidden, vocab, draft_vocab=None, aux_ids=None, norm_before_residual=False,
              target_hidden=None, seed=0, heads=4, kv_heads=2, scale=1.0, inter=None, extra_config=None):
    """A random head written in `layout` ("specforge" or "speculators"); returns its SpecForge-named tensors."""
    path.mkdir(parents=True, exist_ok=True)
    draft_vocab = draft_vocab or vocab
    tensors = head_tensors(hidden, vocab, draft_vocab, heads, kv_heads, inter, seed, target_hidden, scale)
    layer = dict(hidden_size=hidden, intermediate_size=tensors["midlayer.mlp.gate_proj.weight"].shape[0],
                 num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=1, vocab_size=vocab,
                 rms_norm_eps=1e-6, max_position_embeddings=512, rope_theta=10000.0, hidden_act="silu")
    if layout == "specforge":
        cfg = dict(layer, architectures=["LlamaForCausalLMEagle3"], model_type="llama", draft_vocab_size=draft_vocab,
                   tie_word_embeddings=False)
        if target_hidden:
            cfg["target_hidden_size"] = target_hidden
        if aux_ids is not None:
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_ids), "use_aux_hidden_state": True}
        if norm_before_residual:
            cfg["norm_before_residual"] = True
        stored = tensors
    else:
        cfg = dict(architectures=["Eagle3Speculator"], speculators_model_type="eagle3",
                   transformer_layer_config=dict(layer, model_type="llama", architectures=["LlamaForCausalLM"]),
                   draft_vocab_size=draft_vocab, norm_before_residual=norm_before_residual,
                   eagle_aux_hidden_state_layer_ids=list(aux_ids) if aux_ids is not None else None,
                   speculators_config={"algorithm": "eagle3", "default_proposal_method": "greedy",
                                       "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                       "verifier": {"name_or_path": None, "architectures": ["LlamaForCausalLM"]}})
        if target_hidden:
            cfg["target_hidden_size"] = target_hidden
        stored = {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
        stored["embed_tokens.weight"] = torch.randn(vocab, hidden)  # speculators may ship one; unused
    cfg.update(extra_config or {})
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in stored.items()}, str(path / "model.safetensors"))
    return tensors


def _rms(x, w, eps=1e-6):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _rope(x, pos, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos[:, None].double() * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :], torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_head(t, embeds, states, positions, attend, heads=4, kv_heads=2, norm_before_residual=False,
                   vocab=None):
    """float64: (target-vocab logits [T, V], pre-norm states [T, H]) of rows whose state inputs are `states`.

    `attend[i, j]`: row i sees row j (all rows are given at once: no cache).
    """
    t = {k: v.double() for k, v in t.items()}
    embeds, states = embeds.double(), states.double()
    n, hdim = embeds.shape
    d = hdim // heads
    normed = _rms(states, t["midlayer.hidden_norm.weight"])
    residual = normed if norm_before_residual else states
    x = torch.cat([_rms(embeds, t["midlayer.input_layernorm.weight"]), normed], -1)
    q = (x @ t["midlayer.self_attn.q_proj.weight"].T).view(n, heads, d)
    k = (x @ t["midlayer.self_attn.k_proj.weight"].T).view(n, kv_heads, d)
    v = (x @ t["midlayer.self_attn.v_proj.weight"].T).view(n, kv_heads, d)
    q, k = _rope(q, positions), _rope(k, positions)
    rep = heads // kv_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(d)
    scores = scores.masked_fill(~attend[None], float("-inf"))
    out = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v).reshape(n, heads * d)
    h = residual + out @ t["midlayer.self_attn.o_proj.weight"].T
    m = _rms(h, t["midlayer.post_attention_layernorm.weight"])
    act = torch.nn.functional.silu(m @ t["midlayer.mlp.gate_proj.weight"].T) * (m @ t["midlayer.mlp.up_proj.weight"].T)
    h = h + act @ t["midlayer.mlp.down_proj.weight"].T
    logits = _rms(h, t["norm.weight"]) @ t["lm_head.weight"].T
    vocab = vocab or logits.shape[-1]
    full = torch.full((n, vocab), float("-inf"), dtype=torch.float64)
    ids = torch.arange(logits.shape[-1]) + (t["d2t"].long() if "d2t" in t else 0)
    full[:, ids] = logits
    return full, h


def reference_fuse(t, target_states):
    """float64 fc over the concatenated target states [T, 3 * target hidden]."""
    return target_states.double() @ t["fc.weight"].double().T
