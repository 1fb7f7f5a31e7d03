"""A decoder layer's per-token ops as one Triton kernel each on a GPU: RMSNorm, SiLU-and-multiply, an
attention layer's q/k norms + RoPE + KV-cache write, and the attention of decode and verification rows;
the norms and SiLU-and-multiply quantize their output for an FP8-block or W8A8 GEMM in the same pass.

On an H200 a bf16 decode step of a Qwen2.5-7B shape ran ~36 kernels a layer, and took 7.2 ms
against 3.4 ms of weight reads: the norms, RoPE, cache writes and activations are a dozen small
kernels a layer, microseconds each even replayed in a CUDA graph (benchmarks/RESULTS.md, GPU).
Each function here replaces one such group. Every kernel works a row (a token, or a token's
head) on its own, so a token's numbers do not depend on how many rows share the call: plain
decoding and a k + 1-row verification agree exactly. Each op rounds where the decoder's torch
code rounds (to the model's dtype after the norm, after each RoPE product, after SiLU), so the
two paths differ by the reductions' order alone.

The decoder calls these where `takes` holds (CUDA tensors, Triton installed, not forced to
torch) and runs its own torch code elsewhere; triton is imported on first use only.
"""

from __future__ import annotations

import torch

from .dispatch import use_triton
from .tuning import GEMV_ROWS


def takes(x: torch.Tensor) -> bool:
    return use_triton(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, quant: tuple | None = None) -> torch.Tensor:
    """weight * rms_norm(x) over the last dimension, normalised in float32 and rounded to x's dtype
    before the scale (as RMSNorm.forward); the result in the dtype torch's product would have. quant:
    the format its consumer GEMM takes its input in (see `quantized`)."""
    from . import gpu_layer_ops_triton

    if quant is None:
        return gpu_layer_ops_triton.rms_norm(x, weight, eps)
    normed, q, scales = gpu_layer_ops_triton.rms_norm(x, weight, eps, None, quant)
    return _attach(normed, quant, q, scales)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                 quant: tuple | None = None) -> tuple:
    """(x + delta, rms_norm of it): a block's residual add and the norm after it in one kernel, the sum
    rounded as torch's add of two tensors of x's dtype rounds it."""
    from . import gpu_layer_ops_triton

    if quant is None:
        return gpu_layer_ops_triton.rms_norm(x, weight, eps, delta)
    total, normed, q, scales = gpu_layer_ops_triton.rms_norm(x, weight, eps, delta, quant)
    return total, _attach(normed, quant, q, scales)


def silu_mul(gate_up: torch.Tensor, quant: tuple | None = None) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] along the last dimension (quant: as rms_norm's)."""
    from . import gpu_layer_ops_triton

    if quant is None:
        return gpu_layer_ops_triton.silu_mul(gate_up)
    out, q, scales = gpu_layer_ops_triton.silu_mul(gate_up, quant)
    return _attach(out, quant, q, scales)


# A producer kernel (a norm, SiLU-and-multiply) quantizes its output as the GEMM that takes it would,
# in the same pass: FP8-block and W8A8 layers then skip their activation quantizer, one launch each.
# The quantized rows ride on the output tensor itself (read by `quantized`), so every other reader,
# and a consumer that cannot take them, sees the output as it always was.
_QUANTIZED = "speclite_quantized"


def quantized(x: torch.Tensor, quant: tuple | None) -> tuple | None:
    """(q, scales) a producer kernel made of x in format quant: ("fp8", group), per token per group of
    columns, or ("int8", None), per token; None where it made none in that format (or quant is None)."""
    if quant is None:
        return None
    made = getattr(x, _QUANTIZED, None)
    return made[1:] if made is not None and made[0] == quant else None


def _attach(x: torch.Tensor, quant: tuple, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    setattr(x, _QUANTIZED, (quant, q, scales))
    return x


def rope_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor,
               cache_v: torch.Tensor, start: int | torch.Tensor, heads: int, kv_heads: int,
               qk_norm: tuple = ()) -> torch.Tensor:
    """From qkv [T, (heads + 2 kv_heads) * D]: q [T, heads, D] with RoPE applied (cos, sin [T, 1, D]),
    and k (with RoPE) and v written into the caches [kv_heads, max_len, D] at slots start + t (an
    int) or slots[t] (a tensor: CUDA-graph steps). qk_norm: ((q_norm weight, k_norm weight), eps)
    for models that norm each head's q and k before RoPE (Qwen3)."""
    from . import gpu_layer_ops_triton

    return gpu_layer_ops_triton.rope_cache(qkv, cos, sin, cache_k, cache_v, start, heads, kv_heads, qk_norm)


def attends(t: int) -> bool:
    """Whether `attention` takes t new rows: decode and verification rows (the GEMMs' batch-invariant
    row counts); a prefill's many rows take torch's flash attention, one pass over the keys for them all."""
    return t <= GEMV_ROWS


def attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
              start: int | torch.Tensor, mask: torch.Tensor | None, heads: int, qk_norm: tuple = (),
              quant: tuple | None = None) -> torch.Tensor:
    """rope_cache and then softmax(q k^T / sqrt(D)) v of the new rows in one kernel: qkv [T, (heads + 2 KV) * D]
    -> rows [T, heads * D] for o_proj, the new keys and values written to the caches [KV, max_len, D] at
    slots start..; start an int or a CUDA-graph step's slots; mask [T, >= start + T] bool (True: seen),
    None: causal. Each row's numbers are those it has alone. quant: o_proj's input format (as rms_norm's),
    taken where the kernel can make it (FP8 groups inside a head)."""
    from . import attention_triton

    t = qkv.shape[0]
    if not attention_triton.quantizes(quant, cache_k.shape[-1]):
        return attention_triton.attention(qkv, cos, sin, cache_k, cache_v, start, mask, heads, qk_norm).reshape(t, -1)
    out, q, scales = attention_triton.attention(qkv, cos, sin, cache_k, cache_v, start, mask, heads, qk_norm, quant)
    return _attach(out.reshape(t, -1), quant, q, scales)


def static_mask(slots: torch.Tensor, pos: torch.Tensor, tree_mask: torch.Tensor, span: int,
                window: int | None) -> torch.Tensor:
    """A CUDA-graph step's attention mask [T, span] (Transformer.forward_static's rule) in one kernel:
    the keys before the first new slot all seen, the new tokens' own keys by tree_mask, a sliding
    window (when set) bounding both; the dozen small ops it replaces each launched a kernel."""
    from . import gpu_layer_ops_triton

    return gpu_layer_ops_triton.static_mask(slots, pos, tree_mask, span, window)
