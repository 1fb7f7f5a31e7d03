"""`speclite quantize` (a model dir -> a quantized model dir) and load-time `--quant`."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from speclite.errors import SpecliteError
from speclite.model.decoder import ModelArgs
from speclite.model.loader import load_model, read_config, read_tensors, resolve_device
from speclite.quant import calib as calibration
from speclite.quant.bnb import nf4_linear
from speclite.quant.fp8 import quantize_fp8_blocks
from speclite.quant.int4 import quantize_rtn, to_gptq
from speclite.quant.int8 import quantize_int8_channel
from speclite.quant.linear import Fp8Linear, Int4Linear, Int8Linear, QuantLinear
from speclite.quant.schemes import (FP8_BLOCK, FP8_BLOCK_SIZE, INT4, LINEARS, LOAD_TIME_SCHEMES, NF4,
                                    check_method, normalize_scheme, quantization_config)
from speclite.quant.writer import checkpoint_bytes, prepare_out_dir, write_model

# Held-out tokens scored for perplexity: enough for a stable number, cheap on a 2-core CPU.
PPL_TOKENS = 2048
_LINEAR_WEIGHT = re.compile(r"model\.layers\.\d+\.(" + "|".join(re.escape(n) for n in LINEARS) + r")\.weight")


@dataclass
class QuantReport:
    scheme: str
    method: str
    out_dir: str
    bytes_before: int  # safetensors bytes of the source checkpoint
    bytes_after: int  # safetensors bytes written
    ppl_before: float | None  # held-out perplexity; None when the model dir has no tokenizer
    ppl_after: float | None
    quantized_linears: int
    seconds: float


def quantize_to_dir(model_dir, out_dir, scheme, method="rtn", group_size=128, sym=False, act_order=False,
                    alpha=0.5, calib=None, calib_samples=128, seq_len=512,
                    progress: Callable[[str], None] | None = None) -> QuantReport:
    started = time.perf_counter()
    scheme = normalize_scheme(scheme)
    method = check_method(scheme, method)
    _check_options(scheme, method, group_size, sym, act_order, alpha, calib, calib_samples, seq_len)
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    config = read_config(model_dir)
    ModelArgs.from_hf(config)  # unsupported architectures fail before any work
    if config.get("quantization_config"):
        raise SpecliteError(f"{model_dir} is already quantized ({config['quantization_config'].get('quant_method')}); quantize the original model")
    calib_text = calibration.read_text(calib or calibration.SHIPPED_CALIB) if method != "rtn" else None
    prepare_out_dir(model_dir, out_dir)
    tokenizer = _tokenizer(model_dir, required=method != "rtn")
    device = resolve_device(None)

    windows = []
    if method != "rtn":
        windows = calibration.token_windows(tokenizer, calib_text, seq_len, calib_samples)
        if not windows:
            raise SpecliteError("the calibration text is too short: it yields no token windows")
    if method == "gptq":
        from speclite.quant.gptq import gptqmodel_quantize

        if progress:
            progress("gptq: GPTQModel quantizes block by block (its per-layer log follows)")
        version = gptqmodel_quantize(model_dir, out_dir, windows, group_size, sym, act_order, device)
        if progress:
            progress(f"gptq: written by GPTQModel {version}")
        return _report(scheme, method, model_dir, out_dir, tokenizer, seq_len, device, started, progress)

    source = read_tensors(model_dir)
    # SmoothQuant folds its factors into the norms of a loaded float32 model first.
    updated: dict[str, torch.Tensor] = {}
    if method == "smoothquant":
        from speclite.quant.smoothquant import smooth_model

        model = load_model(model_dir, device, torch.float32)
        smooth_model(model, windows, alpha, progress)
        updated = {name: p.detach().cpu() for name, p in model.named_parameters()}
        del model

    out: dict[str, torch.Tensor] = {}
    quantized = 0
    for name, tensor in source.items():
        if _LINEAR_WEIGHT.fullmatch(name):
            quantized += 1
            module = name[: -len(".weight")]
            for suffix, t in _quantized_tensors(scheme, module, updated.get(name, tensor), group_size, sym).items():
                out[f"{module}.{suffix}"] = t
            if progress:
                progress(f"{scheme} {module}")
        else:
            # Smoothing rescales norms; everything else is copied bit for bit in its own dtype.
            out[name] = updated[name].to(tensor.dtype) if name in updated else tensor
    if not quantized:
        raise SpecliteError(f"{model_dir}: found no decoder linear weights to quantize")
    config = dict(config)
    config["quantization_config"] = quantization_config(scheme, group_size, sym, act_order)
    write_model(out_dir, model_dir, out, config)
    del source, out, updated
    return _report(scheme, method, model_dir, out_dir, tokenizer, seq_len, device, started, progress)


def _report(scheme, method, model_dir: Path, out_dir: Path, tokenizer, seq_len, device, started,
            progress) -> QuantReport:
    """Sizes before and after, and held-out perplexity of both models when there is a tokenizer."""
    ppl_before = ppl_after = None
    windows = []
    if tokenizer is not None:
        heldout = calibration.read_text(calibration.SHIPPED_HELDOUT)
        windows = calibration.token_windows(tokenizer, heldout, seq_len, max(1, PPL_TOKENS // seq_len))
    quantized = load_model(out_dir, device)
    count = sum(1 for m in quantized.modules() if isinstance(m, QuantLinear))
    if windows:
        if progress:
            progress("perplexity of the original and the quantized model")
        ppl_after = perplexity(quantized, windows)
        del quantized
        ppl_before = perplexity(load_model(model_dir, device), windows)
    return QuantReport(scheme, method, str(out_dir), checkpoint_bytes(model_dir), checkpoint_bytes(out_dir),
                       ppl_before, ppl_after, count, time.perf_counter() - started)


def _check_options(scheme, method, group_size, sym, act_order, alpha, calib, calib_samples, seq_len) -> None:
    if scheme == INT4 and (not isinstance(group_size, int) or group_size <= 0 or group_size % 8):
        raise SpecliteError(f"--group-size must be a positive multiple of 8, got {group_size}")
    if act_order and method != "gptq":
        raise SpecliteError("--act-order needs --method gptq")
    if calib is not None and method == "rtn":
        raise SpecliteError("--calib is used only by --method gptq or smoothquant; rtn needs no data")
    if not 0.0 <= alpha <= 1.0:
        raise SpecliteError(f"--alpha must lie in [0, 1], got {alpha}")
    if calib_samples < 1 or seq_len < 2:
        raise SpecliteError("--calib-samples must be >= 1 and --seq-len >= 2")
    if sym and scheme != INT4:
        raise SpecliteError(f"--sym applies to int4 only ({scheme} is always symmetric)")


def _tokenizer(model_dir: Path, required: bool):
    try:
        return calibration.load_tokenizer(model_dir)
    except SpecliteError:
        if required:
            raise
        return None


def _quantized_tensors(scheme, module, weight, group_size, sym) -> dict[str, torch.Tensor]:
    if scheme == FP8_BLOCK:
        values, scale = quantize_fp8_blocks(weight, FP8_BLOCK_SIZE)
        return {"weight": values, "weight_scale_inv": scale}
    if scheme == INT4:
        return to_gptq(quantize_rtn(weight, group_size, sym), module)
    q, scale = quantize_int8_channel(weight)
    return {"weight": q, "weight_scale": scale}


def perplexity(model, windows: list[torch.Tensor]) -> float:
    total, count = 0.0, 0
    device = model.inv_freq.device
    with torch.no_grad():
        for w in windows:
            w = w.to(device)
            logits = model(w, model.new_cache(w.numel()))
            total += torch.nn.functional.cross_entropy(logits[:-1].float(), w[1:], reduction="sum").item()
            count += w.numel() - 1
    return math.exp(total / count)


def quantize_model(model, scheme, group_size=128, sym=False):
    """Load-time RTN (nf4: bitsandbytes' quantizer) of every decoder linear of a loaded Transformer.

    `scheme` is BODY or BODY/HEAD: lm_head stays high precision unless a HEAD scheme is named
    (e.g. "int4/w8a8": int4 linears, int8 head, as llama.cpp's Q4_0 keeps a 6-bit output tensor).
    """
    body, _, head = str(scheme).partition("/")
    body = normalize_scheme(body, LOAD_TIME_SCHEMES)
    if not isinstance(group_size, int) or group_size <= 0:
        raise SpecliteError(f"group size must be a positive integer, got {group_size}")
    for block in model.model.layers:
        for name in LINEARS:
            _replace(block, name, body, group_size, sym)
    if head:
        quantize_lm_head(model, head, group_size, sym)
    return model


def quantize_lm_head(model, scheme, group_size=128, sym=False):
    """lm_head at load time; the embeddings stay, so a tied head gets its own quantized copy."""
    _replace(model, "lm_head", normalize_scheme(scheme, LOAD_TIME_SCHEMES), group_size, sym)
    return model


def _replace(parent_module: nn.Module, name: str, scheme: str, group_size: int, sym: bool) -> None:
    linear = parent_module.get_submodule(name)
    if not isinstance(linear, nn.Linear):
        raise SpecliteError(f"--quant {scheme} needs a dense {name}: this one is already quantized")
    weight = linear.weight.detach()
    bias = None if linear.bias is None else linear.bias.detach()
    dtype, device = weight.dtype, weight.device
    if scheme == FP8_BLOCK:
        values, scale = quantize_fp8_blocks(weight, FP8_BLOCK_SIZE)
        new = Fp8Linear(values, scale, FP8_BLOCK_SIZE, bias, dtype, device)
    elif scheme == INT4:
        new = Int4Linear(quantize_rtn(weight.cpu(), group_size, sym), bias, dtype, device)
    elif scheme == NF4:
        new = nf4_linear(weight, bias, dtype, device)
    else:
        q, scale = quantize_int8_channel(weight)
        new = Int8Linear(q, scale, bias, dtype, device)
    parent, _, attr = name.rpartition(".")
    setattr(parent_module.get_submodule(parent), attr, new)
