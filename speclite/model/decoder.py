"""The whole Llama-family decoder (Llama 2/3.x, Qwen2/2.5, Qwen3, Mistral) in one file.

Module and parameter names mirror the Hugging Face checkpoints (model.layers.N.self_attn.q_proj...),
so safetensors load by name and quantized linears slot in where their tensors say so.
One forward serves prefill, one-token decode and k+1-token verification: it appends the new
tokens' keys/values to a static cache at cache.length and attends over everything before them.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from speclite import kernels
from speclite.kernels import cpu_gemm, cpu_layer_ops, cpu_sampling, gpu_layer_ops
from speclite.kernels.cpu_threads import one_thread
from speclite.kernels.dense import HALF
from speclite.errors import SpecliteError
from speclite.model.kv_cache import KVCache
from speclite.model.step import NOTHING, Step, Tree, Wants
from speclite.sampling import SamplingParams, uniforms

# HF architecture name -> our family tag.
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MiMoForCausalLM": "qwen2",  # Qwen2 layers; its MTP modules (model.mtp_layers.*) are --sp-type mtp's
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# A chain's mask before it is built: causal over the cache. The one-call step's kernels take it as no
# mask at all; layers run one by one get it built (Transformer._run).
CAUSAL = object()


def architecture_family(cfg: dict) -> str:
    """The decoder family of a config's `architectures`; one this decoder does not run is a one-line error."""
    archs = cfg.get("architectures") or []
    family = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
    if family is None:
        name = archs[0] if archs else cfg.get("model_type", "unknown")
        raise SpecliteError(f"unsupported architecture '{name}': speclite runs {', '.join(sorted(ARCHITECTURES))}")
    return family


@dataclass(frozen=True)
class ModelArgs:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: dict  # rope_type, rope_theta and the scaling parameters of that type
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    sliding_window: int | None

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelArgs":
        family = architecture_family(cfg)
        heads = cfg["num_attention_heads"]
        # Old configs keep rope_theta/rope_scaling at the top level; transformers 5 nests them.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
        rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
        if rope["rope_type"] not in ROPE_TYPES:
            raise SpecliteError(f"unsupported RoPE scaling '{rope['rope_type']}': speclite runs {', '.join(ROPE_TYPES)}")
        window = cfg.get("sliding_window")
        if family in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
            window = None
        attention_bias = cfg.get("attention_bias", False)
        return cls(
            family=family,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            rope=rope,
            qkv_bias=family == "qwen2" or attention_bias,
            o_bias=family in ("llama", "mistral", "qwen3") and attention_bias,
            mlp_bias=cfg.get("mlp_bias", False),
            qk_norm=family == "qwen3",
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            sliding_window=window,
        )


def rope_inv_freq(args: ModelArgs) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the cos/sin scale for the config's RoPE type (float32)."""
    rope, dim = args.rope, args.head_dim
    base = rope["rope_theta"]
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    kind = rope["rope_type"]
    if kind == "linear":
        return inv_freq / rope["factor"], 1.0
    if kind == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old_len = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        middle = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(middle, blended, scaled), 1.0
    if kind == "yarn":
        factor = rope["factor"]
        old_len = rope.get("original_max_position_embeddings") or args.max_position_embeddings
        attn_factor = rope.get("attention_factor")
        if attn_factor is None:
            mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
            def m(scale, ms=1.0):
                return 1.0 if scale <= 1 else 0.1 * ms * math.log(scale) + 1.0
            attn_factor = m(factor, mscale) / m(factor, mscale_all) if mscale and mscale_all else m(factor)
        beta_fast, beta_slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1

        def correction_dim(rotations):
            return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if rope.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        extrapolate = 1 - ramp
        return (inv_freq / factor) * (1 - extrapolate) + inv_freq * extrapolate, attn_factor
    return inv_freq, 1.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, quant: tuple | None = None) -> torch.Tensor:
        """quant: the input format of the GEMM the norm feeds (input_format): on a GPU its kernel
        quantizes its output in that format too."""
        # Normalise in float32 like the reference implementation, scale in the model dtype.
        if self.weight.dtype == x.dtype and cpu_layer_ops.takes(x) and not cpu_gemm.needs_grad(x, [self]):
            return cpu_layer_ops.rms_norm(x, self.weight, self.eps)
        if gpu_layer_ops.takes(x) and not cpu_gemm.needs_grad(x, [self]):
            return gpu_layer_ops.rms_norm(x, self.weight, self.eps, quant)
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * h.to(x.dtype)

    def after_add(self, x: torch.Tensor, delta: torch.Tensor,
                  quant: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, its norm): a residual add and the norm that follows it, one kernel on a GPU."""
        if (gpu_layer_ops.takes(x) and delta.dtype == x.dtype and delta.shape == x.shape and not hooked([self])
                and not cpu_gemm.needs_grad(x, [self])):
            return gpu_layer_ops.add_rms_norm(x, delta, self.weight, self.eps, quant)
        x = x + delta
        return x, self(x, quant)


class Linear(nn.Linear):
    """nn.Linear on speclite's CPU kernels where they apply (cpu_gemm.module_matrices), else kernels.linear."""

    input_quant = None  # its input as it is (QuantLinear.input_quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # the kernels take [M, K]: a state [H] too
        mats = cpu_gemm.module_matrices(rows, [self])
        if mats is None:
            return kernels.linear(x, self.weight, self.bias)
        y = cpu_gemm.matmul(rows, mats)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])

    def rows(self, index: torch.Tensor) -> "Linear":
        """A Linear of these output rows only (copies: a head over some tokens, FR-Spec's)."""
        return Linear.holding(self.weight[index].contiguous(),
                              None if self.bias is None else self.bias[index].contiguous())

    @staticmethod
    def holding(weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Linear":
        """A frozen Linear whose parameters are these tensors (not copied, nothing drawn)."""
        out = Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        out.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            out.bias = nn.Parameter(bias, requires_grad=False)
        return out

    @staticmethod
    def cpu_matrices(linears) -> cpu_gemm.Matrices | None:
        """The linears (one input) for one AVX2 kernel call (cpu_gemm.module_matrices)."""
        return cpu_gemm.dense_matrices([m.weight for m in linears], cpu_gemm.joined_bias(linears))

    @staticmethod
    def gpu_join_dims(linears) -> dict | None:
        """join_projections: weights of one dtype and input width, joined as rows."""
        first = linears[0].weight
        if all(m.weight.dtype == first.dtype and m.weight.shape[1] == first.shape[1] for m in linears):
            return {"weight": 0}
        return None


def rope_tables(pos: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, 1, head_dim] for positions `pos`, computed in float32, stored in `dtype`."""
    freqs = torch.outer(pos.to(torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).to(dtype)[:, None, :], (emb.sin() * scale).to(dtype)[:, None, :]


def rope_rows(owner: nn.Module, pos: torch.Tensor | slice, max_len: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """rope_tables of `owner`'s RoPE (its inv_freq and rope_scale) for positions `pos` (< max_len; a
    slice: consecutive ones, a chain): rows of tables computed once for every position of the cache and
    kept on the owner (the same numbers: each element is computed on its own). The six ops per step
    cost more than the lookup on the CPU, and on a GPU they were six kernels a step against two (none
    for a chain, whose rows are a view)."""
    tables = owner.__dict__.get("_rope_tables")
    if (tables is None or tables[0].shape[0] < max_len or tables[0].dtype != dtype
            or tables[0].device != owner.inv_freq.device):
        tables = owner._rope_tables = rope_tables(torch.arange(max_len, device=owner.inv_freq.device),
                                                  owner.inv_freq, owner.rope_scale, dtype)
    with one_thread(device):  # a prompt's rows picked by a tensor went through OpenMP (kernels.cpu_threads)
        return tables[0][pos], tables[1][pos]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attended(start, t: int, cache_k: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[int, int]:
    """For the CPU attention kernels: the first new token's cache slot and how many keys to attend.
    The static path's positions are a tensor (no CUDA graphs on a CPU): read them, and attend the
    keys its mask spans (forward_static's span)."""
    if isinstance(start, int):
        return start, start + t
    return int(start[0]), cache_k.shape[1] if mask is None else mask.shape[-1]


def causal_mask(start: int, t: int, device) -> torch.Tensor:
    """[T, start + T] bool: the new rows at slots start.. each see the keys up to their own slot."""
    return torch.arange(start + t, device=device)[None, :] <= torch.arange(start, start + t, device=device)[:, None]


def hooked(modules) -> bool:
    """Whether a module has forward hooks (calibration records each linear's input): such modules are
    called one by one, never fused away."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def input_format(*linears: nn.Module) -> tuple | None:
    """The format the linears' GPU GEMMs quantize their input to (QuantLinear.input_quant), where they
    share one and no hook watches them: the kernel making that input (a norm, SiLU-and-multiply, the
    attention) then quantizes it too, and the GEMMs skip their own activation quantizer."""
    quant = getattr(linears[0], "input_quant", None)
    if quant is None or any(getattr(m, "input_quant", None) != quant for m in linears[1:]) or hooked(linears):
        return None
    return quant


def project(x: torch.Tensor, *linears: nn.Module) -> torch.Tensor:
    """The linears' outputs on x (q, k and v; gate and up) side by side in one tensor: one kernel
    call where cpu_matrices joins them (x quantized or widened once, one thread team), or where
    join_projections made their weights rows of one tensor (a GPU)."""
    if hooked(linears):
        return torch.cat([m(x) for m in linears], dim=-1)
    mats = cpu_gemm.module_matrices(x, linears)
    if mats is not None:
        return cpu_gemm.matmul(x, mats)
    joined = getattr(linears[0], "joined", None)
    if joined is not None and _pointers(linears) == joined[1]:  # the tensors are still its views
        return joined[0](x)
    return torch.cat([m(x) for m in linears], dim=-1)


def join_projections(*models: nn.Module) -> None:
    """Where the GPU layer ops run: each block's q/k/v and gate/up tensors (weights, biases, a
    quantized layer's scales and zeros) become ranges of one tensor each, so `project` runs one GEMM
    where it ran three (two) and a cat; the modules keep their tensors (views now: no byte added,
    the state dict unchanged). Layers of one class whose `gpu_join_dims` allows it: dense ones of
    one dtype, W4A16 of one group and act-order, FP8 blocks whole per part, W8A8. Call after
    loading and quantizing, before the first forward and before capturing CUDA graphs."""
    for model in models:
        for module in model.modules():
            if isinstance(module, Attention):
                _join([module.q_proj, module.k_proj, module.v_proj])
            elif isinstance(module, MLP):
                _join([module.gate_proj, module.up_proj])


def _join(linears: list[nn.Module]) -> None:
    first, cls = linears[0], type(linears[0])
    tensors = [*first.parameters(recurse=False), *first.buffers(recurse=False)]
    if not (all(type(m) is cls for m in linears) and hasattr(cls, "gpu_join_dims") and tensors
            and gpu_layer_ops.takes(tensors[0])):
        return
    dims = cls.gpu_join_dims(linears)  # tensor name -> the dimension the parts' outputs lie along
    biases = [m.bias for m in linears]
    if dims is None or not (all(b is None for b in biases) or all(b is not None and b.dtype == biases[0].dtype
                                                                   for b in biases)):
        return
    if biases[0] is not None:
        dims = dims | {"bias": 0}
    joint = copy.copy(first)  # its settings (group size, path); its own tensor tables, filled below
    joint._parameters, joint._buffers = dict(first._parameters), dict(first._buffers)
    joint.__dict__.pop("joined", None)
    joint.out_features = sum(m.out_features for m in linears)
    with torch.no_grad():
        for name, dim in dims.items():
            parts = [getattr(m, name) for m in linears]
            whole = torch.cat(parts, dim)
            setattr(joint, name, _like(parts[0], whole))
            at = 0
            for m, part in zip(linears, parts):
                setattr(m, name, _like(part, whole.narrow(dim, at, part.shape[dim])))
                at += part.shape[dim]
    first.joined = (joint, _pointers(linears))


def _like(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """new as a parameter where old was one (a module's buffers stay plain tensors)."""
    return nn.Parameter(new, requires_grad=old.requires_grad) if isinstance(old, nn.Parameter) else new


def _pointers(linears) -> list[int]:
    return [t.data_ptr() for m in linears for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))]


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        h, d = args.hidden_size, args.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, d
        self.q_proj = Linear(h, args.num_heads * d, bias=args.qkv_bias)
        self.k_proj = Linear(h, args.num_kv_heads * d, bias=args.qkv_bias)
        self.v_proj = Linear(h, args.num_kv_heads * d, bias=args.qkv_bias)
        self.o_proj = Linear(args.num_heads * d, h, bias=args.o_bias)
        if args.qk_norm:
            self.q_norm = RMSNorm(d, args.rms_norm_eps)
            self.k_norm = RMSNorm(d, args.rms_norm_eps)
        self.qk_norm = args.qk_norm

    def forward(self, x, cos, sin, layer_cache: tuple[torch.Tensor, torch.Tensor], start: int, mask):
        t, h, kv, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = project(x, self.q_proj, self.k_proj, self.v_proj)
        cache_k, cache_v = layer_cache
        if self.cpu_attention_applies(qkv, cache_k) and not cpu_gemm.needs_grad(qkv):
            # The q/k norms, RoPE, the cache write and attention in one call.
            out = cpu_layer_ops.attention(qkv, cos, sin, cache_k, cache_v, h, kv, *attended(start, t, cache_k, mask),
                                          mask, *self.qk_norm_weights())
            return self.o_proj(out)
        if self.gpu_rope_applies(qkv, cache_k) and gpu_layer_ops.attends(t):
            # Decode and verification rows: the q/k norms, RoPE, the cache write and attention in one kernel.
            return self.o_proj(gpu_layer_ops.attention(qkv, cos, sin, cache_k, cache_v, start, mask, h,
                                                       self.qk_norm_weights(), input_format(self.o_proj)))
        if self.gpu_rope_applies(qkv, cache_k):
            # A prefill's rows: the q/k norms, RoPE and the cache write in one kernel, then torch's SDPA.
            q = gpu_layer_ops.rope_cache(qkv, cos, sin, cache_k, cache_v, start, h, kv, self.qk_norm_weights())
        else:
            q, k, v = qkv.split([h * d, kv * d, kv * d], dim=-1)
            q, k, v = q.reshape(t, h, d), k.reshape(t, kv, d), v.reshape(t, kv, d)
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            if isinstance(start, int):
                cache_k[:, start:start + t] = k.transpose(0, 1)
                cache_v[:, start:start + t] = v.transpose(0, 1)
            else:
                cache_k.index_copy_(1, start, k.transpose(0, 1))
                cache_v.index_copy_(1, start, v.transpose(0, 1))
        if isinstance(start, int):
            # Dynamic shapes: attend over the filled part of the cache only.
            keys, values = cache_k[:, :start + t], cache_v[:, :start + t]
        else:
            # Static shapes (CUDA graphs): positions are a tensor, the cache's first span keys (the
            # mask's width) are attended under the mask, so every launch in a span has one shape.
            keys, values = cache_k[:, :mask.shape[-1]], cache_v[:, :mask.shape[-1]]
        # No mask reads as causal (as every attention kernel reads it); from the cache's start that is
        # SDPA's own causal rule, which keeps its flash backend (a mask sends grouped heads to its math).
        from_start = mask is None and t > 1 and isinstance(start, int) and start == 0
        if mask is None and t > 1 and not from_start:
            mask = causal_mask(start, t, x.device)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            keys.unsqueeze(0),
            values.unsqueeze(0),
            attn_mask=mask,
            is_causal=from_start,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return self.o_proj(out.squeeze(0).transpose(0, 1).reshape(t, -1))

    def input_format(self) -> tuple | None:
        return input_format(self.q_proj, self.k_proj, self.v_proj)

    def cpu_attention_applies(self, qkv: torch.Tensor, cache_k: torch.Tensor) -> bool:
        """The C attention takes qkv and the cache (one dtype), and the q/k norms if any (that dtype,
        no hook: a hook would never fire inside the call)."""
        norms = (self.q_norm, self.k_norm) if self.qk_norm else ()
        return (cache_k.dtype == qkv.dtype and cpu_layer_ops.takes(qkv) and not hooked(norms)
                and all(n.weight.dtype == qkv.dtype for n in norms))

    def gpu_rope_applies(self, qkv: torch.Tensor, cache_k: torch.Tensor) -> bool:
        """The GPU kernel takes qkv and the caches, and the q/k norms if any (qkv's dtype, no hook)."""
        norms = (self.q_norm, self.k_norm) if self.qk_norm else ()
        return (gpu_layer_ops.takes(qkv) and qkv.dim() == 2 and qkv.stride(-1) == 1 and cache_k.is_contiguous()
                and not hooked(norms) and all(n.weight.dtype == qkv.dtype for n in norms)
                and not cpu_gemm.needs_grad(qkv, norms))

    def qk_norm_weights(self) -> tuple:
        """(the q and k norm weights, eps) for the C attention and the GPU kernel, or () without q/k norms."""
        return ((self.q_norm.weight, self.k_norm.weight), self.q_norm.eps) if self.qk_norm else ()


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        h, i, b = args.hidden_size, args.intermediate_size, args.mlp_bias
        self.gate_proj = Linear(h, i, bias=b)
        self.up_proj = Linear(h, i, bias=b)
        self.down_proj = Linear(i, h, bias=b)

    def input_format(self) -> tuple | None:
        return input_format(self.gate_proj, self.up_proj)

    def forward(self, x):
        gate_up = project(x, self.gate_proj, self.up_proj)
        if cpu_layer_ops.takes(gate_up) and not cpu_gemm.needs_grad(gate_up):
            return self.down_proj(cpu_layer_ops.swiglu(gate_up))
        if gpu_layer_ops.takes(gate_up) and not cpu_gemm.needs_grad(gate_up):
            return self.down_proj(gpu_layer_ops.silu_mul(gate_up, input_format(self.down_proj)))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, x, cos, sin, layer_cache, start, mask):
        x, delta = self.run(x, None, cos, sin, layer_cache, start, mask)
        return x if delta is None else x + delta

    def run(self, x, pending, cos, sin, layer_cache, start, mask) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The block on the residual stream x + pending (pending: the block before's MLP output, not yet
        added; or None) -> (stream, its own MLP output, left for the next norm to add in its kernel: one
        kernel a layer fewer on a GPU) or (whole output, None)."""
        fused = self.cpu_layer(x, layer_cache)
        if fused is not None:
            x = x if pending is None else x + pending
            return cpu_layer_ops.decoder_layers(fused, x, cos, sin, [layer_cache],
                                                *attended(start, x.shape[0], layer_cache[0], mask), mask)[0], None
        if pending is None:
            h = self.input_layernorm(x, self.self_attn.input_format())
        else:
            x, h = self.input_layernorm.after_add(x, pending, self.self_attn.input_format())
        x, h = self.post_attention_layernorm.after_add(x, self.self_attn(h, cos, sin, layer_cache, start, mask),
                                                       self.mlp.input_format())
        return x, self.mlp(h)

    def cpu_layer(self, x: torch.Tensor, layer_cache) -> cpu_layer_ops.Layers | None:
        """The whole block as one C call and one thread team (built once), where the CPU kernels take
        every part of it (cpu_layer_applies, build_cpu_layer) and no hook or gradient wants its modules."""
        if not self.cpu_layer_applies(x, layer_cache[0]):
            return None
        modules = self.kernel_modules()
        # A hook anywhere inside would never fire in the one call (the block's own already ran).
        if hooked([self.self_attn, self.mlp, *modules]) or cpu_gemm.needs_grad(x, modules):
            return None

        def build():
            layer = self.build_cpu_layer(x)
            return None if layer is None else cpu_layer_ops.Layers([layer], modules)

        return cpu_gemm.cached(self, modules, build)

    def cpu_layer_applies(self, x: torch.Tensor, cache_k: torch.Tensor) -> bool:
        """x, the cache and the norms (q/k norms included) of one dtype the kernels take."""
        norms = (self.input_layernorm, self.post_attention_layernorm)
        return (x.dim() == 2 and cache_k.dtype == x.dtype and cpu_layer_ops.takes(x)
                and all(n.weight.dtype == x.dtype for n in norms) and self.self_attn.cpu_attention_applies(x, cache_k))

    def kernel_modules(self) -> list[nn.Module]:
        attn, mlp = self.self_attn, self.mlp
        return [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj,
                self.input_layernorm, self.post_attention_layernorm, *([attn.q_norm, attn.k_norm] if attn.qk_norm else [])]

    def build_cpu_layer(self, x: torch.Tensor, head: dict | None = None) -> cpu_layer_ops.Layer | None:
        """The Layer struct (with a drafting head's extras, see cpu_layer_ops.Layer), or None where a
        linear's class has no CPU kernel for it."""
        q, k, v, o, gate, up, down, norm1, norm2 = self.kernel_modules()[:9]
        mats = [cpu_gemm.module_matrices(x, g) for g in ([q, k, v], [o], [gate, up], [down])]
        if any(m is None for m in mats):
            return None
        attn = self.self_attn
        return cpu_layer_ops.Layer(mats, [norm1.weight, norm2.weight], norm1.eps, attn.num_heads, attn.num_kv_heads,
                                   attn.head_dim, attn.qk_norm_weights()[0] if attn.qk_norm else None, head)


class Backbone(nn.Module):
    """HF's `model.` prefix: embeddings, blocks, final norm."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        # Left undrawn (the loader fills it): nn.Embedding's own normal_ on the meta device imports
        # torch._dynamo, about 1.5 s and 120 MiB of every start.
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size,
                                         _weight=torch.empty(args.vocab_size, args.hidden_size))
        self.layers = nn.ModuleList(Block(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


def embed_rows(embed: nn.Module, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The tokens' rows of an embedding module in `dtype` (a 16-bit table's widened, exactly): on the CPU
    kernels' path a gather in C (cpu_layer_ops.embed says why), else the module's."""
    if type(embed) is nn.Embedding and not hooked([embed]) and not cpu_gemm.needs_grad(embed.weight, [embed]):
        table = embed.weight
        exact = table.dtype == dtype or (dtype == torch.float32 and table.dtype in HALF)
        if exact and cpu_layer_ops.takes(table) and tokens.device.type == "cpu":
            return cpu_layer_ops.embed(table, tokens, dtype)
    return embed(tokens).to(dtype)


def over_tokens(logits: torch.Tensor, tokens: torch.Tensor, width: int) -> torch.Tensor:
    """Logits [..., n] of a head over some tokens only (row i: token tokens[i]) -> [..., width], -inf
    for every other token: what sampling and argmax read, as if the head covered them all."""
    full = logits.new_full((*logits.shape[:-1], width), float("-inf"))
    full[..., tokens] = logits
    return full


class Transformer(nn.Module):
    # Where the head covers some tokens only (a drafter restricted to a token map, `restricted`):
    # its rows' token ids, int64, ascending. Its logits come out over the whole vocabulary.
    vocab_map: torch.Tensor | None = None

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Backbone(args)
        self.lm_head = Linear(args.hidden_size, args.vocab_size, bias=False)
        self.inv_freq, self.rope_scale = None, 1.0
        self.checkpoint_dir = None  # where load_model read the weights: methods read extra tensors there (MTP)

    def init_rope(self, device) -> None:
        # Computed outside the meta-device construction, on the model's device.
        inv_freq, self.rope_scale = rope_inv_freq(self.args)
        self.inv_freq = inv_freq.to(device)

    def restricted(self, head: nn.Module, tokens: torch.Tensor) -> "Transformer":
        """This model with `head`, whose rows are the logits of `tokens` (int64, ascending) only: the
        same blocks and embedding, shared, so a proposer drafts through a head a fraction of the size
        while other users of the model keep the whole one."""
        view = Transformer.__new__(Transformer)
        nn.Module.__init__(view)
        view.args, view.model, view.lm_head = self.args, self.model, head
        view.inv_freq, view.rope_scale, view.checkpoint_dir = self.inv_freq, self.rope_scale, self.checkpoint_dir
        view.vocab_map = tokens.contiguous()
        return view

    def tie_weights(self):
        if self.args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype: the final norm's (norms are never quantized, nor narrowed to 16-bit
        storage as linears and embedding tables may be, speclite.model.narrow)."""
        return self.model.norm.weight.dtype

    def new_cache(self, max_len: int) -> KVCache:
        a = self.args
        return KVCache(a.num_layers, a.num_kv_heads, max_len, a.head_dim, self.dtype, self.model.norm.weight.device)

    def _mask(self, start: int, t: int, device, tree: Tree | None) -> torch.Tensor | None:
        """Causal over the cache; among the new tokens of a tree, each sees its ancestors only."""
        window = self.args.sliding_window
        end = start + t
        if t == 1 and (window is None or end <= window):
            return None
        if tree is None:
            q_pos = torch.arange(start, end, device=device)
            k_pos = torch.arange(end, device=device)
            mask = causal_mask(start, t, device)
        else:
            q_pos = start + tree.depth
            k_pos = torch.cat([torch.arange(start, device=device), q_pos])
            mask = torch.cat([torch.ones(t, start, dtype=torch.bool, device=device), tree.mask], dim=1)
        if window is not None:
            mask &= k_pos[None, :] > q_pos[:, None] - window
        return mask

    def forward(self, tokens: torch.Tensor, cache: KVCache, num_logits: int | None = None) -> torch.Tensor:
        """Logits [T', vocab] for the last `num_logits` of the T new tokens (all when None).

        The tokens are appended at cache.length and the cache advances by T.
        """
        return self.step(tokens, cache, num_logits).logits

    def step(self, tokens: torch.Tensor, cache: KVCache, num_logits: int | None = None, tree: Tree | None = None,
             wants: Wants = NOTHING) -> Step:
        """Like forward, plus the hidden states `wants` names; with `tree`, the tokens are a token
        tree (row 0 the last committed token) at positions cache.length + depth."""
        if tokens.dim() != 1:  # a batch dimension would reach the C kernels as one long row
            raise SpecliteError(f"tokens must be one sequence of ids [T], got shape {list(tokens.shape)}")
        t, start = tokens.shape[0], cache.length
        if start + t > cache.max_len:
            raise SpecliteError(f"sequence of {start + t} tokens exceeds the context of {cache.max_len}")
        pos = slice(start, start + t) if tree is None else start + tree.depth
        # A chain's causal mask is built only if a layer runs outside the one-call step (_run).
        mask = CAUSAL if tree is None and self.args.sliding_window is None else self._mask(start, t, tokens.device, tree)
        step = self._run(tokens, pos, cache, start, mask, num_logits, wants)
        cache.length = start + t
        return step

    def greedy_chain(self, token: int, cache: KVCache, steps: int, vocab: int) -> list[int] | None:
        """`steps` greedy tokens after `token`: token is fed, the argmax of the first `vocab` logits is
        the next token and is fed, and so on (the cache gains `steps` entries). One C call on the CPU
        where its kernels take the whole model, the embedding and head included; None where they do
        not (or a sliding window or an embedding hook asks for the step-by-step path): the caller
        then steps. A draft model's greedy chain, without Python between its tokens."""
        chained = self._chain(token, cache, steps, vocab, None, None, NOTHING)
        return None if chained is None else chained[0]

    def chain(self, token: int, cache: KVCache, steps: int, vocab: int, params: SamplingParams,
              generator: torch.Generator, wants: Wants = NOTHING) -> tuple[list[int], Step] | None:
        """Plain decoding's chunks: as greedy_chain where params is greedy, else each token drawn from
        the warp (params) of the first `vocab` logits with the next uniform of `generator`, as
        speclite.sampling.pick draws it on the CPU; and the states `wants` names of every row fed
        (`token`, then the tokens but the last; the Step's logits empty), for a proposer that drafts
        from them. Where it declines (as greedy_chain), nothing is drawn."""
        warp = None if params.greedy else cpu_sampling.Warp.of(params)
        chained = self._chain(token, cache, steps, vocab, warp, generator, wants)
        if chained is None:
            return None
        tokens, layers, final = chained
        return tokens, Step(self.model.norm.weight.new_empty((0, self.args.vocab_size)), final, layers)

    def _chain(self, token, cache, steps, vocab, warp, generator, wants):
        start, whole = cache.length, self.kernel_decoder(cache)
        if whole is None or start + steps > cache.max_len:
            return None
        drawn = None if warp is None else uniforms(generator, steps)
        chained = cpu_layer_ops.chain(whole, token, start, vocab, steps, warp, drawn, wants.layers, wants.final)
        cache.length = start + steps
        return chained

    def kernel_decoder(self, cache: KVCache) -> cpu_layer_ops.Decoder | None:
        """The whole model, embedding and head included, for C calls that run several forwards with
        `cache` (greedy chains, speculative iterations); None where the CPU kernels do not take all of
        it, or where a sliding window or an embedding hook asks for the step-by-step path."""
        embed = self.model.embed_tokens
        if self.args.sliding_window is not None or type(embed) is not nn.Embedding or hooked([embed]):
            return None
        layers = self.cpu_layers(embed.weight[:1].to(self.dtype), cache)
        if layers is None or layers.head is None:
            return None
        cos, sin = self.rope(slice(0, cache.max_len), cache.max_len, self.dtype, embed.weight.device)
        return cpu_layer_ops.Decoder(layers, embed.weight, cache.layers, cos, sin, self.vocab_map)

    def forward_static(self, tokens: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, tree_mask: torch.Tensor,
                       cache: KVCache, wants: Wants = NOTHING, span: int | None = None) -> Step:
        """A tree (or chain) of tokens at positions `pos` written to cache `slots` (consecutive),
        with shapes that never change: every input is a device tensor.

        The caller advances cache.length; nothing here reads it, so the call can be captured in
        a CUDA graph once and replayed at any position below `span` (default: the whole cache): only
        the cache's first span keys are read.
        """
        t, span = tokens.shape[0], cache.max_len if span is None else span
        if gpu_layer_ops.takes(tokens):
            mask = gpu_layer_ops.static_mask(slots, pos, tree_mask, span, self.args.sliding_window)
            return self._run(tokens, pos, cache, slots, mask, None, wants)
        rel = torch.arange(span, device=tokens.device) - slots[0]
        inside = (rel >= 0) & (rel < t)
        at = rel.clamp(0, t - 1)
        mask = (rel < 0)[None, :] | (tree_mask[:, at] & inside[None, :])
        if self.args.sliding_window is not None:
            k_pos = torch.where(inside, pos[at], rel + slots[0])
            mask &= k_pos[None, :] > pos[:, None] - self.args.sliding_window
        return self._run(tokens, pos, cache, slots, mask, None, wants)

    def cpu_layers(self, x: torch.Tensor, cache: KVCache) -> cpu_layer_ops.Layers | None:
        """Every block, and the final norm and lm_head where the kernels take them, as one C call and
        one thread team (built once; hooks and gradients checked per call), where each block's own
        CPU layer applies."""
        cache_k = cache.layers[0][0]
        if not (x.dim() == 2 and cache_k.dtype == x.dtype and cpu_layer_ops.takes(x)):
            return None  # what may change per call; what the modules decide is decided once, in build
        blocks, norm, head = self.model.layers, self.model.norm, self.lm_head

        def build():
            built = [b.build_cpu_layer(x) if b.cpu_layer_applies(x, cache_k) else None for b in blocks]
            if None in built:
                return None
            mats = cpu_gemm.module_matrices(x, [head]) if norm.weight.dtype == x.dtype else None
            # Every module of every block, the blocks included, and the head's: a hook on any of them must fire.
            return cpu_layer_ops.Layers(built, [m for b in blocks for m in b.modules()] + [norm, head],
                                        None if mats is None else cpu_layer_ops.Head(mats, norm.weight, norm.eps))

        layers = cpu_gemm.cached(self, [blocks, norm, head], build, deep=True)
        if layers is None or any(layers.hooks) or cpu_gemm.needs_grad(x, [blocks, norm, head]):
            return None
        return layers

    def rope(self, pos: torch.Tensor | slice, max_len: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_rows(self, pos, max_len, dtype, device)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The tokens' embedding rows in the activations' dtype (embed_rows)."""
        return embed_rows(self.model.embed_tokens, tokens, self.dtype)

    def _run(self, tokens, pos, cache: KVCache, start, mask, num_logits, wants: Wants) -> Step:
        x = self.embed(tokens)
        cos, sin = self.rope(pos, cache.max_len, x.dtype, x.device)
        fused, pending = self.cpu_layers(x, cache), None  # pending: a block's MLP output, not yet added
        if fused is not None:
            rows = min(num_logits, x.shape[0]) if num_logits else x.shape[0]  # as normed[-num_logits:] below
            x, layers, head = cpu_layer_ops.decoder_layers(fused, x, cos, sin, cache.layers,
                                                           *attended(start, x.shape[0], cache.layers[0][0],
                                                                     None if mask is CAUSAL else mask),
                                                           None if mask is CAUSAL else mask,
                                                           wants.layers, rows, wants.final)
            if head is not None:  # the final norm and the logits came out of the same call
                return Step(self._whole(head[1]), head[0], layers)
        else:
            if mask is CAUSAL:  # the GPU's attention reads no mask as causal; torch's SDPA needs one built
                mask = None if gpu_layer_ops.takes(x) else self._mask(start, x.shape[0], x.device, None)
            layers, n = {}, len(self.model.layers)
            for i, (layer, layer_cache) in enumerate(zip(self.model.layers, cache.layers)):
                if pending is not None and (i in wants.layers or hooked([layer])):  # the stream whole
                    x, pending = x + pending, None
                if i in wants.layers:
                    layers[i] = x
                if hooked([layer]):  # called, so its hooks fire
                    x = layer(x, cos, sin, layer_cache, start, mask)
                else:  # its residual add left to the next norm's kernel
                    x, pending = layer.run(x, pending, cos, sin, layer_cache, start, mask)
            if n in wants.layers:
                x, pending = x if pending is None else x + pending, None
                layers[n] = x
        # Only the rows whose logits are asked for are normed, unless the final state is wanted too.
        rows = slice(None) if wants.final or num_logits is None else slice(-num_logits, None)
        if pending is None:
            normed = self.model.norm(x[rows])
        else:
            normed = self.model.norm.after_add(x[rows], pending[rows])[1]
        final = normed if wants.final else None
        logits = self.lm_head(normed if num_logits is None else normed[-num_logits:])
        return Step(self._whole(logits), final, layers)

    def _whole(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's logits over the whole vocabulary (a restricted head's spread out, over_tokens)."""
        return logits if self.vocab_map is None else over_tokens(logits, self.vocab_map, self.args.vocab_size)
