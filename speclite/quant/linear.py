"""Quantized drop-in replacements for nn.Linear.

On CUDA they keep the packed weights and call speclite.kernels. On the CPU, int4 and w8a8 run
speclite's own AVX2 kernels (kernels/cpu_gemm: weights repacked once here, activations quantized
to int8 per call, integer dot products) where the CPU and a compiler allow; otherwise the fastest
torch path measured on the 2-core dev machine (torch 2.13, see speclite/quant/README.md): int4 ->
aten._weight_int4pack_mm_for_cpu, w8a8 -> aten._weight_int8pack_mm, both with bf16 activations
(15-50x slower with float32 ones). fp8 -> weights dequantized once at load (FP8 is a storage
format only on the CPU), then the dense kernels.
The bitsandbytes modules (an optional dependency) are in bnb.py.
Quantized tensors are buffers, not parameters: the loader fills only parameters left on meta.
"""

from __future__ import annotations

import torch
from torch import nn

from speclite import kernels
from speclite.kernels import cpu_gemm, gpu_layer_ops
from speclite.kernels.dispatch import fp8_dot_supported
from speclite.quant.fp8 import dequantize_fp8_blocks
from speclite.quant.int4 import Int4Weight, pack_nibbles

INT4PACK_GROUPS = (32, 64, 128, 256)


def use_kernels(device, kernels=None) -> bool:
    """kernels=None: speclite.kernels on CUDA, torch's CPU fast path elsewhere. Tests pass True on
    the CPU to run the kernel path (the kernels' own torch reference there)."""
    return torch.device(device).type == "cuda" if kernels is None else kernels


class QuantLinear(nn.Module):
    """Shared shape handling; subclasses implement _matmul(x, bias) on a 2-D input: x @ W^T + bias."""

    # The activations' format this layer's GPU GEMM quantizes them to, ("fp8", group) or ("int8", None),
    # where a producer kernel may hand them over quantized (gpu_layer_ops.quantized); None: it takes them
    # as they are. Decided at construction: the decoder reads it for every layer of every forward.
    input_quant: tuple | None = None

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None, dtype, device, kernels=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.use_kernels = use_kernels(device, kernels)
        self.bias = None if bias is None else nn.Parameter(bias.to(device=device, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        made = gpu_layer_ops.quantized(x, self.input_quant)  # read before the reshape makes a new tensor
        x = x.reshape(-1, shape[-1])
        mats = cpu_gemm.module_matrices(x, [self])  # the CPU kernels, bias included
        if mats is not None:
            y = cpu_gemm.matmul(x, mats)
        else:  # the bias in the GPU kernels' GEMMs (one launch fewer), added after elsewhere
            y = self._matmul(x, self.bias) if made is None else self._matmul_quantized(*made, x.dtype, self.bias)
        return y.reshape(*shape[:-1], self.out_features)

    @staticmethod
    def cpu_matrices(linears) -> cpu_gemm.Matrices | None:
        """The linears (one input) for one CPU kernel call (cpu_gemm.module_matrices): those whose
        weights were dequantized at load are dense; subclasses add their own formats."""
        if not all(m.path == "dequantized" for m in linears):
            return None
        return cpu_gemm.dense_matrices([m.weight for m in linears], cpu_gemm.joined_bias(linears))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, path={self.path}"


class Fp8Linear(QuantLinear):
    def __init__(self, weight, scale_inv, block, bias, dtype, device, kernels=None):
        n, k = weight.shape
        super().__init__(k, n, bias, dtype, device, kernels)
        if self.use_kernels:
            self.path = "fp8_block_gemm"
            scale_inv = scale_inv.float()
            if scale_inv.numel() == 1:  # per-tensor scale: the same value in every 128x128 block
                block = (128, 128)
                scale_inv = scale_inv.reshape(1, 1).expand(-(-n // 128), -(-k // 128)).contiguous()
            self.block = tuple(block)
            self.register_buffer("weight", weight.to(device))
            self.register_buffer("weight_scale_inv", scale_inv.to(device))
            # Producers quantize to e4m3 in Triton, which needs an fp8-capable GPU there (or runs interpreted).
            if not self.weight.is_cuda or fp8_dot_supported(self.weight):
                self.input_quant = ("fp8", self.block[1])
        else:
            self.path = "dequantized"
            self.register_buffer("weight", dequantize_fp8_blocks(weight, scale_inv, block, dtype).to(device))

    def _matmul(self, x, bias):
        if self.use_kernels:
            return kernels.fp8_block_gemm(x, self.weight, self.weight_scale_inv, self.block, bias)
        return plus(kernels.linear(x, self.weight), bias)

    def _matmul_quantized(self, q, scales, dtype, bias):
        return kernels.fp8_block_gemm_quantized(q, scales, self.weight, self.weight_scale_inv, self.block, dtype, bias)

    @staticmethod
    def gpu_join_dims(linears) -> dict | None:
        """decoder.join_projections on a GPU: FP8 blocks of one shape, each part whole blocks of rows, so
        the joined scale rows line up; weights and scales joined as rows."""
        first = linears[0]
        if all(m.path == "fp8_block_gemm" and m.block == first.block and m.out_features % first.block[0] == 0
               for m in linears):
            return {"weight": 0, "weight_scale_inv": 0}
        return None


class Int8Linear(QuantLinear):
    """int8 per-channel weights: a W8A8 checkpoint, or weight-only int8 (bitsandbytes LLM.int8).

    W8A8 quantizes activations per token at run time, as the format specifies: int8_gemm with
    kernels, our AVX2 kernel on the CPU. Weight-only (`quantize_activations=False`) keeps the
    activations in bf16 on torch's int8pack op: LLM.int8 keeps outlier features in 16 bits, which
    per-token int8 activations would round away.
    """

    def __init__(self, weight, weight_scale, bias, dtype, device, kernels=None, quantize_activations=True):
        n, k = weight.shape
        super().__init__(k, n, bias, dtype, device, kernels)
        if self.use_kernels:
            self.path = "int8_gemm"
            self.input_quant = ("int8", None)
            self.register_buffer("weight", weight.to(device=device, dtype=torch.int8))
            self.register_buffer("weight_scale", weight_scale.float().reshape(n, 1).to(device))
        elif quantize_activations and cpu_gemm.available():
            self.path = "cpu_w8a8"  # per-token int8 activations, as the format specifies
            self.register_buffer("weight", cpu_gemm.pack_int8(weight))
            self.register_buffer("weight_scale", weight_scale.float().reshape(n).contiguous())
        elif k % 16 == 0:
            # The op needs K % 16 == 0 (other K crash or go wrong, measured) and a freshly
            # allocated weight: a memory-mapped checkpoint tensor may be unaligned, which crashes it.
            self.path = "int8pack"
            self.register_buffer("weight", weight.to(torch.int8).clone())
            self.register_buffer("weight_scale", weight_scale.reshape(n).to(torch.bfloat16))
        else:
            self.path = "dequantized"
            self.register_buffer("weight", (weight.float() * weight_scale.float().reshape(n, 1)).to(dtype))

    def _matmul(self, x, bias):
        if self.use_kernels:
            return kernels.int8_gemm(x, self.weight, self.weight_scale, bias)
        if self.path == "dequantized":
            return plus(kernels.linear(x, self.weight), bias)
        if self.path == "cpu_w8a8":  # where module_matrices passes (a gradient wanted): the same numbers
            return plus(cpu_gemm.matmul(x, cpu_gemm.int8_matrices([self.weight], [self.weight_scale], self.in_features)),
                        bias)
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.weight, self.weight_scale)
        return plus(y.to(x.dtype), bias)

    def _matmul_quantized(self, q, scales, dtype, bias):
        return kernels.int8_gemm_quantized(q, scales, self.weight, self.weight_scale, dtype, bias)

    @staticmethod
    def gpu_join_dims(linears) -> dict | None:
        """decoder.join_projections on a GPU: W8A8 weights and their per-channel scales joined as rows."""
        return {"weight": 0, "weight_scale": 0} if all(m.path == "int8_gemm" for m in linears) else None

    @staticmethod
    def cpu_matrices(linears) -> cpu_gemm.Matrices | None:
        if all(m.path == "cpu_w8a8" for m in linears):
            return cpu_gemm.int8_matrices([m.weight for m in linears], [m.weight_scale for m in linears],
                                          linears[0].in_features, cpu_gemm.joined_bias(linears))
        return QuantLinear.cpu_matrices(linears)


class Int4Linear(QuantLinear):
    """W4A16 from an Int4Weight (GPTQ/AWQ/RTN all arrive in that form)."""

    def __init__(self, w: Int4Weight, bias, dtype, device, kernels=None):
        n, k = w.q.shape
        super().__init__(k, n, bias, dtype, device, kernels)
        self.group_size = w.group_size
        # A column order that puts each group's channels together (None: groups of uneven size), and the
        # same where it moves any (act-order checkpoints; else None: no gather needed).
        perm = _contiguous_group_order(w.g_idx, w.group_size)
        shuffle = None if perm is None or _in_order(w.g_idx, w.group_size) else perm
        if self.use_kernels:
            self.path = "w4a16_gemm"
            # Act-order (g_idx a shuffle of whole groups): the input channels kept in group order and x's
            # columns gathered to match each call, so every K tile lies in one group (the kernel's fast
            # tiles: a tile gathering each channel's scale compiles to 0.49-0.76 warp instructions a
            # weight in ~9x the shared memory, against 0.14-0.26; tests/hopper_compile.py).
            # Only groups that cannot be put in order keep g_idx.
            if shuffle is not None:
                w = Int4Weight(w.q[:, shuffle], w.zeros, w.scales, w.g_idx[shuffle], w.group_size)
            self.register_buffer("qweight", pack_nibbles(w.q.t(), 0).to(device))
            self.register_buffer("qzeros", pack_nibbles(w.zeros, 1).to(device))  # real zeros (v2)
            self.register_buffer("scales", w.scales.to(device))
            self.register_buffer("g_idx", None if _in_order(w.g_idx, w.group_size) else w.g_idx.to(device))
            self.register_buffer("perm", None if shuffle is None else shuffle.to(device))
            return
        if perm is not None and w.group_size % 32 == 0 and cpu_gemm.available():
            self.path = "cpu_int4"
            packed = cpu_gemm.pack_int4(w.q[:, perm], w.scales, w.zeros, w.group_size)
            for name, t in zip(("qweight", "scales", "zeros"), packed):
                self.register_buffer(name, t)
            self.register_buffer("perm", shuffle)
        elif n % 16 == 0 and w.group_size in INT4PACK_GROUPS and perm is not None:
            self.path = "int4pack"
            q = w.q.long()[:, perm].to(torch.int32)
            self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
            # The op computes (q - 8) * scale + zero; ours is (q - z) * s = (q - 8) * s + (8 - z) * s.
            s = w.scales.float()
            shift = (8 - w.zeros.float()) * s
            self.register_buffer("scales_zeros", torch.stack([s, shift], dim=-1).to(torch.bfloat16).contiguous())
            self.register_buffer("perm", shuffle)
        else:
            # Shapes the packed op cannot take (N % 16, odd group sizes, uneven act-order groups).
            self.path = "dequantized"
            self.register_buffer("weight", w.dequantize(dtype).to(device))

    @staticmethod
    def cpu_matrices(linears) -> cpu_gemm.Matrices | None:
        """cpu_int4 linears of one group size in column order: one activation quantization and one
        thread team for all (a layer's q, k and v), the same numbers as one call each."""
        first = linears[0]
        if all(m.path == "cpu_int4" and m.perm is None and m.group_size == first.group_size for m in linears):
            return cpu_gemm.int4_matrices([(m.qweight, m.scales, m.zeros) for m in linears],
                                          [m.out_features for m in linears], first.in_features, first.group_size,
                                          cpu_gemm.joined_bias(linears))
        return QuantLinear.cpu_matrices(linears)

    def _matmul(self, x, bias):
        if self.use_kernels:
            x = x if self.perm is None else x[:, self.perm]
            return kernels.w4a16_gemm(x, self.qweight, self.qzeros, self.scales, self.g_idx, self.group_size, bias)
        if self.path == "dequantized":
            return plus(kernels.linear(x, self.weight), bias)
        if self.path == "cpu_int4":  # act-order columns (perm), or a gradient wanted: the same numbers
            x = x if self.perm is None else x[:, self.perm]
            return plus(cpu_gemm.matmul(x, cpu_gemm.int4_matrices([(self.qweight, self.scales, self.zeros)],
                                                                  [self.out_features], self.in_features,
                                                                  self.group_size)), bias)
        xb = x.to(torch.bfloat16)
        if self.perm is not None:
            xb = xb[:, self.perm]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.packed, self.group_size, self.scales_zeros)
        return plus(y.to(x.dtype), bias)

    @staticmethod
    def gpu_join_dims(linears) -> dict | None:
        """decoder.join_projections on a GPU: W4A16 parts of one group size, scale dtype and input-channel
        groups (act-order), each a multiple of 8 wide (qzeros packs 8 outputs a word), joined as columns
        of qweight, qzeros and scales (the kernel takes their row strides)."""
        first = linears[0]
        if all(m.path == "w4a16_gemm" and m.group_size == first.group_size and m.out_features % 8 == 0
               and m.scales.dtype == first.scales.dtype and _same(m.g_idx, first.g_idx) and _same(m.perm, first.perm)
               for m in linears):
            return {"qweight": 1, "qzeros": 1, "scales": 1}
        return None


def plus(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y + bias, where the path's product did not add it."""
    return y if bias is None else y + bias


def _contiguous_group_order(g_idx: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """A column order in which group i is exactly columns [i*g, (i+1)*g), or None if none exists."""
    if g_idx.numel() % group_size:
        return None
    perm = torch.argsort(g_idx.long(), stable=True)
    return perm if _in_order(g_idx[perm], group_size) else None


def _in_order(g_idx: torch.Tensor, group_size: int) -> bool:
    """Whether input channel k is in group k // group_size for every k."""
    return torch.equal(g_idx.long(), torch.arange(g_idx.numel(), device=g_idx.device) // group_size)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is b or (a is not None and b is not None and torch.equal(a, b))

