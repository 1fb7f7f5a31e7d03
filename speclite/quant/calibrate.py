"""Calibration statistics of one decoder block (SmoothQuant): what its linears' inputs look like."""

from __future__ import annotations

import torch

from speclite.quant.blockwise import BlockRunner


def block_input_absmax(runner: BlockRunner, block, hidden: list[torch.Tensor],
                       names: list[str]) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """Per-input-channel max |x| of each named linear of `block` over every window, and the block's outputs."""
    stats: dict[str, torch.Tensor] = {}
    hooks = []
    for name in names:
        def hook(module, args, name=name):
            amax = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0).float()
            stats[name] = torch.maximum(stats[name], amax) if name in stats else amax
        hooks.append(block.get_submodule(name).register_forward_pre_hook(hook))
    try:
        out = runner.run(block, hidden)
    finally:
        for h in hooks:
            h.remove()
    return stats, out
