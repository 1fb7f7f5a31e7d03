"""Run calibration windows through our decoder and collect activation statistics (SmoothQuant)."""

from __future__ import annotations

import torch


def input_absmax(model, windows: list[torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    """Per-input-channel max |x| seen by each named linear over all calibration windows."""
    stats: dict[str, torch.Tensor] = {}
    hooks = []
    for name in names:
        def hook(module, args, name=name):
            amax = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0).float()
            stats[name] = torch.maximum(stats[name], amax) if name in stats else amax
        hooks.append(model.get_submodule(name).register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            for w in windows:
                model(w.to(model.inv_freq.device), model.new_cache(w.numel()))
    finally:
        for h in hooks:
            h.remove()
    return stats
