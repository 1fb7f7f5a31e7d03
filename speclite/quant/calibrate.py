"""Run calibration windows through our decoder: activation statistics and block-by-block GPTQ."""

from __future__ import annotations

from typing import Callable

import torch

from speclite.quant.gptq import HessianAccumulator, gptq_quantize
from speclite.quant.int4 import Int4Weight
from speclite.quant.schemes import LINEARS


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


class _Stop(Exception):
    pass


def _first_block_inputs(model, windows):
    """(x, cos, sin, mask) entering block 0 for every window; the forward stops right there."""
    captured = []

    def grab(module, args):
        x, cos, sin, _cache, _start, mask = args
        captured.append((x, cos, sin, mask))
        raise _Stop

    hook = model.model.layers[0].register_forward_pre_hook(grab)
    try:
        for w in windows:
            try:
                model(w.to(model.inv_freq.device), model.new_cache(w.numel()))
            except _Stop:
                pass
    finally:
        hook.remove()
    return captured


def gptq_model(model, windows, group_size: int, sym: bool, act_order: bool,
               progress: Callable[[str], None] | None = None) -> dict[str, Int4Weight]:
    """Quantize every block's linears with GPTQ, block after block.

    Each block sees inputs produced by the already-quantized blocks before it (as in the
    paper), and its linears' weights are replaced in place by their dequantized values.
    """
    results: dict[str, Int4Weight] = {}
    longest = max(w.numel() for w in windows)
    with torch.no_grad():
        samples = _first_block_inputs(model, windows)
        scratch = model.new_cache(longest).layers[0]  # start=0 every time: reuse one layer cache
        for i, block in enumerate(model.model.layers):
            prefix = f"model.layers.{i}"
            modules = {n: block.get_submodule(n) for n in LINEARS}
            acc = {n: HessianAccumulator(m.in_features, m.weight.device) for n, m in modules.items()}
            hooks = [m.register_forward_pre_hook(lambda mod, args, a=acc[n]: a.add(args[0])) for n, m in modules.items()]
            try:
                for x, cos, sin, mask in samples:
                    block(x, cos, sin, scratch, 0, mask)
            finally:
                for h in hooks:
                    h.remove()
            for n, m in modules.items():
                w = gptq_quantize(m.weight.data, acc[n].h, group_size, sym, act_order)
                results[f"{prefix}.{n}"] = w
                m.weight.data.copy_(w.dequantize(m.weight.dtype).to(m.weight.device))
                if progress:
                    progress(f"gptq {prefix}.{n}")
            samples = [(block(x, cos, sin, scratch, 0, mask), cos, sin, mask) for x, cos, sin, mask in samples]
    return results
