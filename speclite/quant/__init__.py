"""Quantization: schemes (fp8-block, int4, w8a8; nf4 at load time), methods (rtn, gptq, smoothquant), checkpoint formats."""

from speclite.quant.quantize import QuantReport, perplexity, quantize_lm_head, quantize_model, quantize_to_dir
from speclite.quant.schemes import SCHEMES, normalize_scheme

__all__ = ["SCHEMES", "QuantReport", "normalize_scheme", "perplexity", "quantize_lm_head", "quantize_model",
           "quantize_to_dir"]
