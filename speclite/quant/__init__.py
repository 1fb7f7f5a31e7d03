"""Quantization: schemes (fp8-block, int4, w8a8; nf4 at load time), methods (rtn, gptq, awq, smoothquant), checkpoint formats."""

from speclite.quant.quantize import QuantProgress, QuantReport, quantize_lm_head, quantize_model, quantize_to_dir
from speclite.quant.schemes import SCHEMES, normalize_scheme

__all__ = ["SCHEMES", "QuantProgress", "QuantReport", "normalize_scheme", "quantize_lm_head", "quantize_model",
           "quantize_to_dir"]
