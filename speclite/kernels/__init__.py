"""Quantized GEMMs and the fused speculative-verification kernel.

Pure tensor functions: CUDA tensors run Triton kernels, CPU tensors (or force_torch(True) /
SPECLITE_FORCE_TORCH=1) run the torch path. Importing this package never imports triton.
"""

from .dense import linear
from .dispatch import force_torch
from .fp8_block import fp8_block_gemm, fp8_block_gemm_quantized, per_token_group_quant_fp8
from .int8 import int8_gemm, int8_gemm_quantized, per_token_quant_int8
from .verify import sample_probs, verify_greedy, verify_rejection
from .w4a16 import w4a16_gemm

__all__ = ["linear", "force_torch", "w4a16_gemm", "per_token_group_quant_fp8", "fp8_block_gemm",
           "fp8_block_gemm_quantized", "per_token_quant_int8", "int8_gemm", "int8_gemm_quantized",
           "sample_probs", "verify_rejection", "verify_greedy"]
