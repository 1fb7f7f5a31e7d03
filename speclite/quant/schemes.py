"""Scheme names, the methods valid for each, and the quantization_config each one writes."""

from __future__ import annotations

from speclite.errors import SpecliteError

FP8_BLOCK, INT4, W8A8, NF4 = "fp8-block", "int4", "w8a8", "nf4"
SCHEMES = (FP8_BLOCK, INT4, W8A8)  # what `speclite quantize` writes
# What `--quant` accepts: nf4 is bitsandbytes' format, quantized at load time only (optional dependency).
LOAD_TIME_SCHEMES = (*SCHEMES, NF4)
# RTP-LLM style spellings users already type (--sp-quantization FP8_PER_BLOCK ...).
ALIASES = {"fp8_per_block": FP8_BLOCK, "fp8-per-block": FP8_BLOCK, "fp8": FP8_BLOCK, "fp8_block": FP8_BLOCK}
METHODS = {FP8_BLOCK: ("rtn",), INT4: ("rtn", "gptq", "awq"), W8A8: ("rtn", "smoothquant")}
FP8_BLOCK_SIZE = (128, 128)
# The linears of every decoder block; lm_head and embeddings always stay high precision.
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def normalize_scheme(name: str, schemes: tuple[str, ...] = SCHEMES) -> str:
    """'FP8_PER_BLOCK' / 'INT4' / 'W8A8' (any case) and the canonical names -> canonical name."""
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if key in LOAD_TIME_SCHEMES and key not in schemes:
        raise SpecliteError(f"{key} is quantized at load time only (--quant {key}): choose from {', '.join(schemes)}")
    if key not in schemes:
        raise SpecliteError(f"unknown quantization scheme '{name}': choose from {', '.join(schemes)} (or FP8_PER_BLOCK, INT4, W8A8)")
    return key


def check_method(scheme: str, method: str) -> str:
    method = str(method).strip().lower()
    if method not in METHODS[scheme]:
        raise SpecliteError(f"--method {method} does not apply to --scheme {scheme}: choose from {', '.join(METHODS[scheme])}")
    return method


def quantization_config(scheme: str, group_size: int, sym: bool, act_order: bool) -> dict:
    if scheme == FP8_BLOCK:
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(FP8_BLOCK_SIZE)}
    if scheme == INT4:
        return {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": act_order,
                "sym": sym, "checkpoint_format": "gptq", "static_groups": False, "true_sequential": False}
    return {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                            "dynamic": False, "observer": "minmax"},
                "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                      "dynamic": True, "observer": None},
                "output_activations": None,
            }
        },
    }


def quantized_bytes(scheme: str, shape: tuple[int, ...], group_size: int) -> int:
    """Bytes one decoder linear weight [N, K] takes on disk in `scheme` (for the free-space check)."""
    n, k = shape
    if scheme == FP8_BLOCK:
        bn, bk = FP8_BLOCK_SIZE
        return n * k + -(-n // bn) * -(-k // bk) * 4
    if scheme == INT4:
        groups = -(-k // group_size)
        return n * k // 2 + groups * n // 2 + groups * n * 2 + k * 4
    return n * k + n * 4
