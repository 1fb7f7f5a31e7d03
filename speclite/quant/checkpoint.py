"""Load the quantized linears of a checkpoint: our own output and published ones.

Formats: "fp8" (block or per-tensor float8_e4m3fn + weight_scale_inv), "gptq" (v1 zero-1 and
gptq_v2 real zeros, desc_act/g_idx), "awq" (GEMM layout), "compressed-tensors"
int-quantized W8A8, and "bitsandbytes" 4-bit / 8-bit (the optional bitsandbytes, see bnb.py).
A linear is replaced only where its quantized tensors are present in the checkpoint (and it is
not lm_head or in the config's ignore list); everything else stays dense and is filled by the
loader afterwards.
"""

from __future__ import annotations

import re
from typing import Callable

import torch
from torch import nn

from speclite.errors import SpecliteError
from speclite.quant.int4 import from_awq, from_gptq
from speclite.quant.linear import Fp8Linear, Int4Linear, Int8Linear, QuantLinear

SUPPORTED = ("fp8", "gptq", "awq", "compressed-tensors", "bitsandbytes")
Builder = Callable[[str, dict, "torch.Tensor | None", torch.dtype, torch.device], "QuantLinear | None"]


def label(qconfig: dict) -> str:
    """A checkpoint's quantization in a summary line's words ("int4 gptq", "fp8", "w8a8", "nf4")."""
    method = str(qconfig.get("quant_method", "")).lower()
    if method in ("gptq", "awq"):
        return f"int{qconfig.get('bits', 4)} {method}"
    if method == "compressed-tensors":
        return "w8a8"
    if method == "bitsandbytes":
        return str(qconfig.get("bnb_4bit_quant_type", "nf4")) if qconfig.get("load_in_4bit") else "int8 (bnb)"
    return method


def load_quantized_linears(model: nn.Module, qconfig: dict, tensors: dict, dtype, device) -> None:
    method = str(qconfig.get("quant_method", "")).lower()
    factories = {"fp8": _fp8, "gptq": _gptq, "awq": _awq, "compressed-tensors": _compressed_tensors,
                 "bitsandbytes": _bitsandbytes}
    if method not in factories:
        raise SpecliteError(f"unsupported quant_method '{method}': speclite loads {', '.join(SUPPORTED)}")
    build = factories[method](qconfig)
    if method == "bitsandbytes":
        from speclite.quant.bnb import dequantize_lm_head

        dequantize_lm_head(tensors)
    ignore = list(qconfig.get("ignore") or []) + list(qconfig.get("modules_to_not_convert") or [])
    ignore += list(qconfig.get("ignored_layers") or []) + list(qconfig.get("llm_int8_skip_modules") or [])
    device = torch.device(device)
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or name == "lm_head" or _ignored(name, ignore):
            continue
        bias = None
        if module.bias is not None:
            if f"{name}.bias" not in tensors:
                raise SpecliteError(f"checkpoint has no tensor '{name}.bias'")
            bias = tensors[f"{name}.bias"]
        qlinear = build(name, tensors, bias, dtype, device)
        if qlinear is None:
            continue
        if (qlinear.in_features, qlinear.out_features) != (module.in_features, module.out_features):
            raise SpecliteError(
                f"quantized '{name}' is [{qlinear.out_features}, {qlinear.in_features}], "
                f"config says [{module.out_features}, {module.in_features}]"
            )
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, qlinear)


def _ignored(name: str, patterns: list[str]) -> bool:
    """compressed-tensors 're:' regexes, else HF's modules_to_not_convert substring rule."""
    for p in patterns:
        if p.startswith("re:"):
            if re.match(p[3:], name):
                return True
        elif p == name or p in name:
            return True
    return False


def _weight_and_scale(tensors: dict, name: str, dtype: torch.dtype, scale_key: str, fmt: str):
    """(weight, scale) of a linear stored as `dtype` values plus a scale tensor; None if its weight
    is not in that dtype (the linear is not quantized in this checkpoint)."""
    weight = tensors.get(f"{name}.weight")
    if weight is None or weight.dtype != dtype:
        return None
    scale = tensors.get(f"{name}.{scale_key}")
    if scale is None:
        raise SpecliteError(f"{fmt} checkpoint: '{name}.{scale_key}' is missing")
    return weight, scale


def _fp8(qconfig: dict) -> Builder:
    fmt = qconfig.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise SpecliteError(f"fp8 checkpoint with fmt '{fmt}': speclite loads e4m3")
    block = tuple(qconfig.get("weight_block_size") or (0, 0))

    def build(name, tensors, bias, dtype, device):
        found = _weight_and_scale(tensors, name, torch.float8_e4m3fn, "weight_scale_inv", "fp8")
        if found is None:
            return None
        weight, scale = found
        if scale.numel() > 1 and not all(block):
            raise SpecliteError(f"fp8 checkpoint: '{name}' has block scales but no weight_block_size in the config")
        return Fp8Linear(weight, scale, block, bias, dtype, device)

    return build


def _gptq(qconfig: dict) -> Builder:
    bits = qconfig.get("bits", 4)
    if bits != 4:
        raise SpecliteError(f"gptq checkpoint with {bits} bits: speclite loads 4-bit GPTQ")
    fmt = qconfig.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise SpecliteError(f"gptq checkpoint_format '{fmt}': speclite loads gptq and gptq_v2")
    group_size = qconfig.get("group_size", 128)

    def build(name, tensors, bias, dtype, device):
        if f"{name}.qweight" not in tensors:
            return None
        qweight = tensors[f"{name}.qweight"]
        g = qweight.shape[0] * 8 if group_size in (-1, None) else group_size
        w = from_gptq(qweight, tensors[f"{name}.qzeros"], tensors[f"{name}.scales"], tensors.get(f"{name}.g_idx"), g, v1=fmt == "gptq")
        return Int4Linear(w, bias, dtype, device)

    return build


def _awq(qconfig: dict) -> Builder:
    version = str(qconfig.get("version", "gemm")).lower()
    if version != "gemm" or qconfig.get("bits", qconfig.get("w_bit", 4)) != 4 or not qconfig.get("zero_point", True):
        raise SpecliteError(f"awq checkpoint {qconfig}: speclite loads 4-bit GEMM AWQ with zero points")
    group_size = qconfig.get("group_size", qconfig.get("q_group_size", 128))

    def build(name, tensors, bias, dtype, device):
        if f"{name}.qweight" not in tensors:
            return None
        w = from_awq(tensors[f"{name}.qweight"], tensors[f"{name}.qzeros"], tensors[f"{name}.scales"], group_size)
        return Int4Linear(w, bias, dtype, device)

    return build


def _compressed_tensors(qconfig: dict) -> Builder:
    fmt = qconfig.get("format")
    if fmt != "int-quantized":
        raise SpecliteError(f"compressed-tensors format '{fmt}': speclite loads int-quantized (W8A8)")
    for group in (qconfig.get("config_groups") or {}).values():
        w, a = group.get("weights") or {}, group.get("input_activations") or {}
        ok_w = w.get("num_bits") == 8 and w.get("type", "int") == "int" and w.get("symmetric", True) and w.get("strategy") == "channel"
        ok_a = a.get("num_bits") == 8 and a.get("dynamic") is True and a.get("strategy") == "token" and a.get("symmetric", True)
        if not (ok_w and ok_a):
            raise SpecliteError(
                "compressed-tensors config group is not W8A8 (8-bit symmetric per-channel weights, "
                "dynamic per-token 8-bit activations): speclite loads only that int-quantized scheme"
            )

    def build(name, tensors, bias, dtype, device):
        found = _weight_and_scale(tensors, name, torch.int8, "weight_scale", "compressed-tensors")
        return None if found is None else Int8Linear(*found, bias, dtype, device)

    return build


def _bitsandbytes(qconfig: dict) -> Builder:
    from speclite.quant import bnb

    if not (qconfig.get("load_in_4bit") or qconfig.get("load_in_8bit")):
        raise SpecliteError("bitsandbytes checkpoint with neither load_in_4bit nor load_in_8bit in its config")
    storage = qconfig.get("bnb_4bit_quant_storage", "uint8")
    if storage != "uint8":
        raise SpecliteError(f"bitsandbytes checkpoint with bnb_4bit_quant_storage '{storage}': speclite loads uint8")
    threshold = float(qconfig.get("llm_int8_threshold", 6.0))
    bnb.require("a bitsandbytes checkpoint")

    def build(name, tensors, bias, dtype, device):
        state = bnb.quant_state(tensors, name, device)
        if state is not None:
            return bnb.Bnb4bitLinear(tensors[f"{name}.weight"], state, bias, dtype, device)
        if f"{name}.SCB" not in tensors:
            return None
        fmt = tensors.get(f"{name}.weight_format")
        if fmt is not None and int(fmt) != 0:  # 0 = row-major; older GPU-tiled layouts are not read
            raise SpecliteError(f"bitsandbytes checkpoint: '{name}' has weight_format {int(fmt)}: speclite loads 0 (row)")
        return bnb.int8_linear(tensors[f"{name}.weight"], tensors[f"{name}.SCB"], threshold, bias, dtype, device)

    return build
