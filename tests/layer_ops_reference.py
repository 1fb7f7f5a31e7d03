"""The decoder's torch code for the ops the GPU kernels fuse (speclite.kernels.gpu_layer_ops): the
reference of tests/test_kernels_gpu_layer_ops.py (interpreted) and tests/test_cuda.py (compiled)."""

import torch
import torch.nn.functional as F

from speclite.model.decoder import rotate


def torch_rms_norm(x, weight, eps):
    """RMSNorm.forward's torch code."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def decoders_rope_cache(qkv, cos, sin, cache_k, cache_v, start, h, kv, qk_norm):
    """The decoder's torch code for the same step (Attention.forward without the kernels)."""
    t, d = qkv.shape[0], cache_k.shape[-1]
    q, k, v = qkv.split([h * d, kv * d, kv * d], dim=-1)
    q, k, v = q.reshape(t, h, d), k.reshape(t, kv, d), v.reshape(t, kv, d)
    if qk_norm:
        (qw, kw), eps = qk_norm
        q, k = torch_rms_norm(q, qw, eps), torch_rms_norm(k, kw, eps)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    slots = start if isinstance(start, torch.Tensor) else torch.arange(start, start + t, device=qkv.device)
    cache_k.index_copy_(1, slots, k.transpose(0, 1))
    cache_v.index_copy_(1, slots, v.transpose(0, 1))
    return q
