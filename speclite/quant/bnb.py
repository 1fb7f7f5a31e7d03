"""bitsandbytes: pre-quantized checkpoints (4-bit nf4/fp4, 8-bit LLM.int8) and load-time nf4.

bitsandbytes is optional (pip install 'speclite[bnb]') and imported only here, when used. The
4-bit format is the library's: QuantState.from_dict reads it, dequantize_4bit / matmul_4bit
compute with it; nothing of NF4 is reimplemented.

CPU paths (measured, speclite/quant/README.md): bitsandbytes' CPU matmul_4bit is ~4x slower
than a bf16 matmul and one dequantize_4bit costs ~2 of them, so a 4-bit linear is dequantized
once at load (memory equal to dense). 8-bit runs Int8Linear's weight-only int8 op with
w = int8 * SCB / 127, 2x faster than bitsandbytes' CPU int8 matmul. On CUDA both keep the
packed weights and call bitsandbytes' own matmuls.
"""

from __future__ import annotations

import logging

import torch

from speclite import kernels
from speclite.errors import SpecliteError
from speclite.quant.linear import Int8Linear, QuantLinear, plus, use_kernels

# transformers' and bitsandbytes' default; compress_statistics (double quant) as QLoRA does it.
NF4_BLOCKSIZE = 64
# Tensors of one 4-bit weight besides the packed values, relative to '<linear>.weight.'.
STATE_PARTS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")


def require(what: str):
    """The bitsandbytes module, or a one-line SpecliteError saying how to install it."""
    # Its CPU backend warns at import about an optional hub kernel that speclite never calls.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    try:
        import bitsandbytes
    except ImportError:
        raise SpecliteError(f"{what} needs bitsandbytes: pip install 'speclite[bnb]'") from None
    return bitsandbytes


def quant_state(tensors: dict, name: str, device):
    """The QuantState of a 4-bit linear `name` in a checkpoint, or None if it is not 4-bit."""
    bnb = require("a bitsandbytes checkpoint")
    qs = bnb.functional.QuantState
    parts = {f"quant_state.{t}": tensors[f"{name}.weight.quant_state.{t}"]
             for t in qs.valid_qs_type_keys if f"{name}.weight.quant_state.{t}" in tensors}
    if not parts:
        return None
    parts.update({p: tensors[f"{name}.weight.{p}"] for p in STATE_PARTS if f"{name}.weight.{p}" in tensors})
    try:
        return qs.from_dict(parts, torch.device(device))
    except (ValueError, KeyError, AssertionError) as e:
        raise SpecliteError(f"bitsandbytes checkpoint: the 4-bit state of '{name}' is unreadable ({e})") from None


def dequantize_lm_head(tensors: dict) -> None:
    """transformers quantizes lm_head too when llm_int8_skip_modules is set; speclite keeps it dense."""
    state = quant_state(tensors, "lm_head", "cpu")
    if state is not None:
        dequantize = require("a bitsandbytes checkpoint").functional.dequantize_4bit
        tensors["lm_head.weight"] = dequantize(tensors["lm_head.weight"], state)
    elif "lm_head.SCB" in tensors:
        tensors["lm_head.weight"] = tensors["lm_head.weight"].float() * (tensors["lm_head.SCB"].float() / 127)[:, None]


# bitsandbytes' result for a row depends on the rows beside it: 4-bit runs one row through a GEMV
# kernel and more through dequantize-and-GEMM; LLM.int8 keeps a column in 16 bits when any row's
# value there passes the threshold (measured on the CPU: a row 0.023 apart in int8, 2e-5 in nf4).
# So a verification's rows (up to 64 drafts + 1: the API's cap on k) each run alone, as plain
# decoding runs them, and greedy speculation keeps plain decoding's tokens; a prefill runs whole.
ROWS_ALONE = 65


def rows_alone(matmul, x: torch.Tensor) -> torch.Tensor:
    if 1 < x.shape[0] <= ROWS_ALONE:
        return torch.cat([matmul(x[i:i + 1]) for i in range(x.shape[0])])
    return matmul(x)


class Bnb4bitLinear(QuantLinear):
    """A bitsandbytes 4-bit weight (nf4 or fp4): packed uint8 [N*K/2, 1] plus its QuantState."""

    def __init__(self, packed: torch.Tensor, state, bias, dtype, device, kernels=None):
        import bitsandbytes

        n, k = state.shape
        super().__init__(k, n, bias, dtype, device, kernels)
        if self.use_kernels:
            self.path = "bnb_matmul_4bit"
            self.register_buffer("weight", packed.to(device))
            state.to(device)  # in place
            self.quant_state = state
        else:
            self.path = "dequantized"
            weight = bitsandbytes.functional.dequantize_4bit(packed, state)
            self.register_buffer("weight", weight.to(device=device, dtype=dtype))

    def _matmul(self, x, bias):
        if self.path == "dequantized":
            return plus(kernels.linear(x, self.weight), bias)
        import bitsandbytes

        return plus(rows_alone(lambda rows: bitsandbytes.matmul_4bit(rows, self.weight.t(), quant_state=self.quant_state),
                               x), bias)


class Bnb8bitLinear(QuantLinear):
    """LLM.int8 through bitsandbytes' matmul: activations quantized per token, input columns with
    a value above llm_int8_threshold kept in fp16 (the outlier split the checkpoint was made for)."""

    def __init__(self, weight: torch.Tensor, scb: torch.Tensor, threshold: float, bias, dtype, device):
        import bitsandbytes

        n, k = weight.shape
        super().__init__(k, n, bias, dtype, device, kernels=True)
        self.path = "bnb_int8"
        self.register_buffer("weight", weight.to(device=device, dtype=torch.int8))
        self.register_buffer("SCB", scb.float().to(device))
        self.state = bitsandbytes.MatmulLtState(CB=self.weight, SCB=self.SCB)
        self.state.threshold, self.state.has_fp16_weights = threshold, False
        # A training state sends CPU inputs to a dequantize-and-matmul route without the outlier split.
        self.state.is_training = False

    def _matmul(self, x, bias):
        import bitsandbytes

        # bitsandbytes quantizes fp16 activations: it would cast (and log a warning) on every call.
        return plus(rows_alone(lambda rows: bitsandbytes.matmul(rows, self.weight, state=self.state),
                               x.to(torch.float16)).to(x.dtype), bias)


def int8_linear(weight, scb, threshold, bias, dtype, device, kernels=None) -> QuantLinear:
    """An LLM.int8 linear: bitsandbytes' matmul with kernels, else Int8Linear (w = int8 * SCB / 127)."""
    if use_kernels(device, kernels):
        return Bnb8bitLinear(weight, scb, threshold, bias, dtype, device)
    return Int8Linear(weight, scb.float() / 127, bias, dtype, device, kernels=False, quantize_activations=False)


def nf4_linear(weight: torch.Tensor, bias, dtype, device, kernels=None) -> Bnb4bitLinear:
    """Load-time `--quant nf4`: bitsandbytes' own quantizer, the same module as a checkpoint's."""
    bnb = require("--quant nf4")
    packed, state = bnb.functional.quantize_4bit(weight, blocksize=NF4_BLOCKSIZE, compress_statistics=True,
                                                 quant_type="nf4")
    return Bnb4bitLinear(packed, state, bias, dtype, device, kernels)
