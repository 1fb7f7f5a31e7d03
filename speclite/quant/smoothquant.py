"""SmoothQuant (Xiao et al., 2022): move activation outliers into the weights before W8A8.

For a linear fed by x, y = W x = (W diag(s)) (x / s); with s_j = max|x_j|^alpha / max|W_:,j|^(1-alpha)
both factors quantize well per token / per channel. The 1/s is folded into whatever produces x,
so the checkpoint keeps the standard layout and needs no extra tensors:
  - q/k/v: into input_layernorm.weight;  gate/up: into post_attention_layernorm.weight;
  - down_proj: into up_proj's output rows (down's input is silu(gate) * up, linear in up);
  - o_proj: not smoothed (its input comes out of attention; folding into v_proj would need one
    factor shared by every query head of a KV group) - it is quantized as is.
"""

from __future__ import annotations

import torch

# The linear whose input stands for each smoothed group (q/k/v share theirs, gate/up theirs).
CALIBRATED = ["self_attn.q_proj", "mlp.gate_proj", "mlp.down_proj"]


def _factors(act_amax: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    w_amax = torch.cat([w.float() for w in weights]).abs().amax(0)
    s = act_amax.clamp(min=1e-5) ** alpha / w_amax.clamp(min=1e-5) ** (1 - alpha)
    # Channels never active or with all-zero weights keep factor 1.
    return torch.where((act_amax > 0) & (w_amax > 0), s, torch.ones_like(s))


def smooth_block(block, stats: dict[str, torch.Tensor], alpha: float) -> None:
    """Fold the factors of one block, from its calibration `stats` (keys: CALIBRATED), into its weights."""
    attn, mlp = block.self_attn, block.mlp
    with torch.no_grad():
        for norm, linears, key in (
            (block.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj], "self_attn.q_proj"),
            (block.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj], "mlp.gate_proj"),
        ):
            s = _factors(stats[key], [m.weight for m in linears], alpha).to(norm.weight.dtype)
            norm.weight.div_(s)
            for m in linears:
                m.weight.mul_(s)
        s = _factors(stats["mlp.down_proj"], [mlp.down_proj.weight], alpha).to(mlp.up_proj.weight.dtype)
        mlp.up_proj.weight.div_(s[:, None])
        if mlp.up_proj.bias is not None:
            mlp.up_proj.bias.div_(s)
        mlp.down_proj.weight.mul_(s)
