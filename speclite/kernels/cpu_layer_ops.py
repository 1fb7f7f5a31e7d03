"""speclite's CPU kernels for a decoder layer (kernels/cpu/kernels.cpp, layer_ops.h): RMSNorm, SwiGLU,
and RoPE + KV-cache write + attention, one C call each instead of ~30 torch ops per layer; and the
whole layer (those and its four cpu_gemm products) in one call and one thread team.

Rows are computed independently of each other (speculative verification stays bit-identical to
plain decoding). `available()` is False without an AVX2 CPU or a compiler (cpu_build picks the ISA path), or with
SPECLITE_CPU_KERNELS=0: the decoder keeps its torch ops.
"""

from __future__ import annotations

import ctypes

import torch

from speclite.kernels import cpu_build
from speclite.kernels.cpu_gemm import Matrices

DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


def available() -> bool:
    return _library() is not None


def takes(x: torch.Tensor) -> bool:
    """Whether x can go through these kernels (a contiguous CPU tensor of a supported dtype)."""
    return x.device.type == "cpu" and x.dtype in DTYPES and available()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * round(x / sqrt(mean(x^2) + eps)) over the last dimension, weight of x's dtype."""
    x = x.contiguous()
    y = torch.empty_like(x)
    _library().speclite_rms_norm(x.data_ptr(), weight.data_ptr(), y.data_ptr(), DTYPES[x.dtype],
                                 x.numel() // x.shape[-1], x.shape[-1], eps)
    return y


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [M, 2I] (gate columns first), rounded as torch rounds it."""
    gate_up = gate_up.contiguous()
    m, i = gate_up.shape[0], gate_up.shape[1] // 2
    y = torch.empty(m, i, dtype=gate_up.dtype)
    _library().speclite_swiglu(gate_up.data_ptr(), y.data_ptr(), DTYPES[gate_up.dtype], m, i)
    return y


def attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
              heads: int, kv_heads: int, start: int, keys: int, mask: torch.Tensor | None,
              qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None, eps: float = 0.0) -> torch.Tensor:
    """RoPE on q and k of the projections qkv [t, (heads + 2 kv_heads) d] (each head RMSNormed first by
    qk_norm's (q weight, k weight) [d] of qkv's dtype, with eps, where given: Qwen3), k and v written to
    the cache [kv_heads, max_len, d] at start.., and attention [t, heads d] over cache keys 0..keys-1
    (mask [t, keys] bool; None: causal from start)."""
    t, d = qkv.shape[0], cache_k.shape[-1]
    out = torch.empty(t, heads * d, dtype=qkv.dtype)
    mask = None if mask is None else mask.to(torch.uint8).contiguous()
    norms = None if qk_norm is None else (_P * 2)(*(w.data_ptr() for w in qk_norm))
    _library().speclite_attention(
        qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), cache_k.data_ptr(), cache_v.data_ptr(), out.data_ptr(),
        None if mask is None else mask.data_ptr(), DTYPES[qkv.dtype], t, heads, kv_heads, d, cache_k.shape[1], start,
        keys, d ** -0.5, norms, eps, torch.get_num_threads())
    return out


class Layer(ctypes.Structure):
    """One decoder block for decoder_layers: its four products (cpu_gemm.Matrices: q/k/v joined, o,
    gate/up joined, down), its two RMSNorm weights (the activations' dtype), Qwen3's q and k norm
    weights or None, and its attention shape. A drafting head's layer also reads an embedding beside
    the state (`head`, see struct Layer in kernels.cpp): EAGLE-3's (hidden_norm weight, whether the
    attention adds to the normed state) or MTP's (hnorm and enorm weights, eh_proj's Matrices,
    whether the state comes first). Mirrors struct Layer in kernels.cpp."""

    _fields_ = [("qkv", ctypes.POINTER(Matrices)), ("o", ctypes.POINTER(Matrices)),
                ("gate_up", ctypes.POINTER(Matrices)), ("down", ctypes.POINTER(Matrices)),
                ("norm1", _P), ("norm2", _P), ("qk_norm", ctypes.POINTER(_P)), ("hnorm", _P),
                ("residual_normed", _I), ("in_proj", ctypes.POINTER(Matrices)), ("enorm", _P), ("state_first", _I),
                ("eps", _F), ("heads", _I), ("kv_heads", _I), ("head_dim", _I)]

    def __init__(self, mats: list[Matrices], norms: list[torch.Tensor], eps: float, heads: int, kv_heads: int,
                 head_dim: int, qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None, head: dict | None = None):
        pair = None if qk_norm is None else (_P * 2)(*(w.data_ptr() for w in qk_norm))
        head = head or {}
        hnorm, enorm, in_proj = head.get("hnorm"), head.get("enorm"), head.get("in_proj")
        super().__init__(*(ctypes.pointer(m) for m in mats), *(n.data_ptr() for n in norms),
                         None if pair is None else ctypes.cast(pair, ctypes.POINTER(_P)),
                         None if hnorm is None else hnorm.data_ptr(), head.get("residual_normed", False),
                         None if in_proj is None else ctypes.pointer(in_proj), None if enorm is None else enorm.data_ptr(),
                         head.get("state_first", False), eps, heads, kv_heads, head_dim)
        self.keep = (mats, norms, qk_norm, pair, head)  # what the pointers point at lives as long as this


class Head(ctypes.Structure):
    """A model's final RMSNorm (weight of the activations' dtype) and its lm_head (cpu_gemm.Matrices),
    run by decoder_layers after the last layer. Mirrors struct Head in kernels.cpp."""

    _fields_ = [("mats", ctypes.POINTER(Matrices)), ("norm", _P), ("eps", _F)]

    def __init__(self, mats: Matrices, norm: torch.Tensor, eps: float):
        super().__init__(ctypes.pointer(mats), norm.data_ptr(), eps)
        self.keep = (mats, norm)


class Layers:
    """Decoder layers for decoder_layers (a model's, or one block's): their Layer structs, an array of
    pointers to them, the model's Head if it runs in the same call, and every module they were built
    from with its forward-hook dicts (filled in place when a hook is registered: `any(hooks)` tells)."""

    def __init__(self, layers: list[Layer], modules: list, head: Head | None = None):
        self.layers, self.modules, self.head = layers, modules, head
        self.no_captures = (_P * (len(layers) + 1))()  # all null
        self.caches = None  # (a cache's layer list, its keys' and values' pointer arrays), built on first use
        self.hooks = [d for m in modules for d in (m._forward_hooks, m._forward_pre_hooks)]
        self.array = (ctypes.POINTER(Layer) * len(layers))(*(ctypes.pointer(ly) for ly in layers))

    def cache_pointers(self, cache_layers: list) -> tuple:
        """The K and V caches' pointer arrays, kept while the same cache is used (its tensors never move)."""
        if self.caches is None or self.caches[0] is not cache_layers:
            n = len(cache_layers)
            self.caches = (cache_layers, (_P * n)(*(k.data_ptr() for k, _ in cache_layers)),
                           (_P * n)(*(v.data_ptr() for _, v in cache_layers)))
        return self.caches[1:]


class Decoder(ctypes.Structure):
    """A whole model for the C calls that run several of its forwards (chain, draft_iterations, head_iterations,
    dflash_iterations):
    its Layers (with their Head), embedding table, KV cache and the RoPE rows of every cache
    position; `vocab_map` (int64, a head row's token) where its head covers some tokens only, a drafter
    restricted by a token map (speclite.speculate.token_map). Mirrors struct Decoder in kernels.cpp."""

    _fields_ = [("layers", _P), ("n", _I), ("head", ctypes.POINTER(Head)), ("embed", _P), ("edt", _I),
                ("caches_k", _P), ("caches_v", _P), ("cos", _P), ("sin", _P), ("max_len", _I), ("scale", _F),
                ("vocab_map", _P)]

    def __init__(self, layers: Layers, embed: torch.Tensor, cache_layers, cos: torch.Tensor, sin: torch.Tensor,
                 vocab_map: torch.Tensor | None = None):
        caches_k, caches_v = layers.cache_pointers(cache_layers)
        super().__init__(ctypes.cast(layers.array, _P), len(layers.layers), ctypes.pointer(layers.head), embed.data_ptr(),
                         DTYPES[embed.dtype], ctypes.cast(caches_k, _P), ctypes.cast(caches_v, _P), cos.data_ptr(),
                         sin.data_ptr(), cache_layers[0][0].shape[1], layers.layers[0].head_dim ** -0.5,
                         None if vocab_map is None else vocab_map.data_ptr())
        self.dtype, self.rope_row = cos.dtype, cos.stride(0) * cos.element_size()  # bytes a position
        self.keep = (layers, embed, cos, sin, caches_k, caches_v, vocab_map)


def embed(table: torch.Tensor, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows `ids` of an embedding table [V, H] in `dtype`: the table's own, or a 16-bit table's widened
    to float32 (exact), in one call on the calling thread. torch's widening copy of a prefill's rows
    spreads over its OpenMP threads past 32768 values, whose spinning after it took the cores from the
    kernels' thread team for the forward (the pair's prefills past 128 tokens 1.6x slower a row)."""
    ids = ids.to(torch.int64).contiguous()
    out = torch.empty(ids.shape[0], table.shape[1], dtype=dtype)
    _library().speclite_embed(table.data_ptr(), DTYPES[table.dtype], ids.data_ptr(), ids.shape[0], table.shape[1],
                              out.data_ptr(), DTYPES[dtype])
    return out


def cat(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    """torch.cat of 2-D tensors of one dtype along dim 0 or -1 (1), on the calling thread where they are
    CPU tensors the kernels take (torch's copy goes parallel past 32768 values: see embed); else
    torch's."""
    first = tensors[0]
    if not (first.dim() == 2 and all(t.dim() == 2 and t.dtype == first.dtype and takes(t) for t in tensors)):
        return torch.cat(tensors, dim)
    parts = [t.contiguous() for t in tensors]
    along_rows = dim == 0
    shape = ((sum(t.shape[0] for t in parts), first.shape[1]) if along_rows
             else (first.shape[0], sum(t.shape[1] for t in parts)))
    out = torch.empty(shape, dtype=first.dtype)
    rows = 1 if along_rows else first.shape[0]
    widths = [t.numel() * t.element_size() // rows for t in parts]
    _library().speclite_cat((_P * len(parts))(*(t.data_ptr() for t in parts)), (ctypes.c_int64 * len(parts))(*widths),
                            len(parts), rows, out.data_ptr())
    return out


def decoder_layers(layers: Layers, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_layers,
                   start: int, keys: int, mask: torch.Tensor | None, wants: tuple[int, ...] = (),
                   logit_rows: int = 0, final: bool = False, embeds: torch.Tensor | None = None):
    """x [t, H] through every layer in one call and one thread team, the same numbers as their modules
    one by one (attention as attention() above: cache written at start.., keys 0..keys-1, mask
    [t, keys] or causal): the output, {i: layer i's input} for i in `wants` (i = the number of
    layers: the last one's output), and, where `layers.head` is set, (the final normed state of
    every row if `final` else None, the logits of the last `logit_rows` rows), else None. `embeds`: an
    EAGLE-3 head's embedding rows [t, H], read by its layer beside x."""
    x = x.contiguous()
    n = len(layers.layers)
    out = torch.empty_like(x)
    head = layers.head
    normed = torch.empty_like(x) if head is not None and final else None
    logits = torch.empty(logit_rows, head.mats.contents.n, dtype=x.dtype) if head is not None else None
    captured = {i: torch.empty_like(x) for i in wants}
    captures = ((_P * (n + 1))(*(captured[i].data_ptr() if i in captured else None for i in range(n + 1)))
                if wants else layers.no_captures)
    caches_k, caches_v = layers.cache_pointers(cache_layers)
    mask = None if mask is None else mask.to(torch.uint8).contiguous()
    first = layers.layers[0]
    embeds = None if embeds is None else embeds.contiguous()
    _library().speclite_decoder_layers(
        layers.array, n, x.data_ptr(), None if embeds is None else embeds.data_ptr(), out.data_ptr(), captures,
        caches_k, caches_v, DTYPES[x.dtype], x.shape[0],
        cos.data_ptr(), sin.data_ptr(), None if mask is None else mask.data_ptr(), cache_layers[0][0].shape[1],
        start, keys, first.head_dim ** -0.5, head, logit_rows, None if normed is None else normed.data_ptr(),
        None if logits is None else logits.data_ptr(), torch.get_num_threads())
    return out, captured, None if head is None else (normed, logits)


def chain(decoder: Decoder, token: int, start: int, vocab: int, steps: int, warp=None,
          uniforms: torch.Tensor | None = None, wants: tuple[int, ...] = (), final: bool = False):
    """`steps` tokens after `token`, in one call and one thread team: the token embedded and run
    through the whole model (a Decoder) at cache position start, the pick from its first `vocab`
    logits (its token through the decoder's vocab_map, where set) fed at start + 1, and so on; the
    cache gains `steps` entries. The pick is the argmax, or with `warp` (a cpu_sampling.Warp) the draw
    with uniforms[i] (float32 [steps]) from the logits' warp. The tokens k single decoder_layers steps and the loop's picks would give, {i: layer i's
    inputs [steps, H]} for i in `wants` (as decoder_layers'), and the final normed states [steps, H]
    where `final` (else None), row r the r-th token fed (`token`, then the picks but the last)."""
    tokens = (ctypes.c_int * steps)()
    rope = start * decoder.rope_row
    warp_at, uniforms_at, _ = _sampling(warp, uniforms)  # (the chain takes one uniform a step)
    n, H = decoder.n, decoder.keep[1].shape[1]
    captured = {i: torch.empty(steps, H, dtype=decoder.dtype) for i in wants}
    normed = torch.empty(steps, H, dtype=decoder.dtype) if final else None
    states = ((_P * (n + 1))(*(captured[i].data_ptr() if i in captured else None for i in range(n + 1)))
              if wants else decoder.keep[0].no_captures)
    _library().speclite_chain(
        decoder.layers, n, decoder.head, decoder.embed, decoder.edt, token, decoder.caches_k, decoder.caches_v,
        DTYPES[decoder.dtype], decoder.cos + rope, decoder.sin + rope, decoder.max_len, start, decoder.scale, vocab,
        decoder.vocab_map, warp_at, uniforms_at, steps, tokens, states, None if normed is None else normed.data_ptr(),
        torch.get_num_threads())
    return list(tokens), captured, normed


def head_chain(layer: Layer, head: Head, embed: torch.Tensor, vocab_map: torch.Tensor | None, tokens: list[int],
               hidden: torch.Tensor, cache_layer, start: int, cos: torch.Tensor, sin: torch.Tensor, steps: int,
               normed_state: bool = False) -> list[int]:
    """`steps` greedy drafts of a one-layer drafting head (EAGLE-3, MTP) in one call and one thread
    team: first the rows of `tokens` (embedding rows of embed [V', H]: hidden's dtype, or a 16-bit
    table widened) beside the states `hidden` [T, H] at positions start.. (cos/sin: RoPE rows of
    positions start..), then one row per step; each step's last row through head's norm and lm_head,
    the argmax mapped through vocab_map (int64 draft id -> token, or None) fed next with the row's
    layer output (or with normed_state, the norm's) as the state. The head's cache (cache_layer: its
    one layer's keys and values) gains T + steps - 1 entries. The drafts its steps one by one would
    give."""
    drafts = (ctypes.c_int * steps)()
    cache_k, cache_v = cache_layer
    hidden = hidden.contiguous()
    _library().speclite_head_chain(
        ctypes.byref(layer), head, embed.data_ptr(), DTYPES[embed.dtype],
        None if vocab_map is None else vocab_map.data_ptr(),
        (ctypes.c_int * len(tokens))(*tokens), len(tokens), hidden.data_ptr(), cache_k.data_ptr(), cache_v.data_ptr(),
        DTYPES[hidden.dtype], cos.data_ptr(), sin.data_ptr(), cache_k.shape[1], start, layer.head_dim ** -0.5, steps,
        normed_state, drafts, torch.get_num_threads())
    return list(drafts)


def draft_iterations(target: Decoder, draft: Decoder, t_len: int, d_len: int, unseen: list[int], mask: int | None,
                     token: int, k: int, d_vocab: int, room: int, enough: int, eos: set[int], seconds: float,
                     warp=None, uniforms: torch.Tensor | None = None):
    """Speculative iterations of a draft model (parallel, from `mask` tokens; or autoregressive, mask
    None) and its target in one call (see speclite_draft_iterations): greedy, or with `warp` (a
    cpu_sampling.Warp) rejection sampling with `uniforms` (float32, taken in the loop's order; the
    call stops before it would run out). ([per iteration (drafts offered, drafts stood, new tokens,
    draft s, verify s)], the target's and the draft's cache lengths after them, the uniforms used)."""
    run, lengths = _Run(room, enough, k), (ctypes.c_int * 3)()
    n = _library().speclite_draft_iterations(
        ctypes.byref(target), ctypes.byref(draft), DTYPES[target.dtype], t_len, d_len, *_ints(unseen),
        -1 if mask is None else mask, token, k, d_vocab, room, enough, *_sampling(warp, uniforms), *_ints(sorted(eos)),
        int(seconds * 1e9), *run.outputs, lengths, torch.get_num_threads())
    return run.iterations(n), (lengths[0], lengths[1]), lengths[2]


def head_iterations(target: Decoder, layers: Layers, vocab_map: torch.Tensor | None, fuse: Matrices | None,
                    aux: list[int], normed_state: bool, head_cache, head_cos: torch.Tensor, head_sin: torch.Tensor,
                    t_len: int, committed: int, pairs: list[int], pending: torch.Tensor, token: int, k: int, room: int,
                    enough: int, eos: set[int], seconds: float, warp=None, uniforms: torch.Tensor | None = None):
    """Speculative iterations of a one-layer drafting head (`layers`: its Layers with their Head) over
    the target's states (the inputs of layers `aux` through `fuse`, or without fuse its final normed
    states) and the target, in one call (see speclite_head_iterations): greedy, or with `warp` (a
    cpu_sampling.Warp) rejection sampling with `uniforms` as draft_iterations takes them. ([per
    iteration (drafts offered, drafts stood, new tokens, draft s, verify s)], (the target's cache
    length, the head's committed entries), the pending states [T, H] after them, the uniforms used)."""
    run, lengths, pending = _Run(room, enough, k), (ctypes.c_int * 4)(), pending.contiguous()
    out = torch.empty(max(k + 1, pending.shape[0]), pending.shape[1], dtype=pending.dtype)
    (cache_k, cache_v), layer = head_cache, layers.layers[0]
    n = _library().speclite_head_iterations(
        ctypes.byref(target), ctypes.byref(layer), layers.head, None if vocab_map is None else vocab_map.data_ptr(),
        None if fuse is None else ctypes.byref(fuse), *_ints(aux), cache_k.data_ptr(), cache_v.data_ptr(),
        head_cos.data_ptr(), head_sin.data_ptr(), cache_k.shape[1], layer.head_dim ** -0.5, normed_state,
        DTYPES[target.dtype], t_len, committed, *_ints(pairs), pending.data_ptr(), token, k, room, enough,
        *_sampling(warp, uniforms), *_ints(sorted(eos)), int(seconds * 1e9), *run.outputs, out.data_ptr(), lengths,
        torch.get_num_threads())
    return run.iterations(n), (lengths[0], lengths[1]), out[: lengths[2]], lengths[3]


def dflash_iterations(target: Decoder, draft: Decoder, kv: list[Matrices], fuse: Matrices, fuse_norm: torch.Tensor,
                      fuse_eps: float, aux: list[int], mask: int, t_len: int, committed: int, pending: torch.Tensor,
                      token: int, k: int, room: int, enough: int, eos: set[int], seconds: float, warp=None,
                      uniforms: torch.Tensor | None = None):
    """Speculative iterations of a DFlash drafter (`draft`: its layers, its norm with the target's
    lm_head as the head, the target's embedding, its cache; kv: each layer's k and v projections)
    over the target's states (the inputs of layers `aux` through fuse and fuse_norm) and the target,
    in one call (see speclite_dflash_iterations): greedy, or with `warp` rejection sampling with
    `uniforms` as draft_iterations takes them. ([per iteration (drafts offered, drafts stood, new
    tokens, draft s, verify s)], (the target's cache length, the drafter's context entries), the
    pending context rows [T, H] after them, the uniforms used)."""
    run, lengths, pending = _Run(room, enough, k), (ctypes.c_int * 4)(), pending.contiguous()
    out = torch.empty(max(k + 1, pending.shape[0]), pending.shape[1], dtype=pending.dtype)
    kvs = (ctypes.POINTER(Matrices) * len(kv))(*(ctypes.pointer(m) for m in kv))
    n = _library().speclite_dflash_iterations(
        ctypes.byref(target), ctypes.byref(draft), kvs, ctypes.byref(fuse), fuse_norm.data_ptr(), fuse_eps, *_ints(aux),
        mask, DTYPES[target.dtype], t_len, committed, pending.shape[0], pending.data_ptr(), token, k, room, enough,
        *_sampling(warp, uniforms), *_ints(sorted(eos)), int(seconds * 1e9), *run.outputs, out.data_ptr(), lengths,
        torch.get_num_threads())
    return run.iterations(n), (lengths[0], lengths[1]), out[: lengths[2]], lengths[3]


def _sampling(warp, uniforms: torch.Tensor | None) -> tuple:
    """(the Warp's pointer, the uniforms' pointer, their count) for a sampling call; nulls when greedy.
    The uniforms are the caller's float32 tensor itself (a converted copy would be freed before the call)."""
    if warp is None:
        return None, None, 0
    assert uniforms.dtype == torch.float32 and uniforms.is_contiguous() and uniforms.device.type == "cpu"
    return ctypes.byref(warp), uniforms.data_ptr(), uniforms.numel()


def _ints(values: list[int]) -> tuple:
    """(a C int array of values, its length) for a kernel's (const int *, int) pair."""
    return (ctypes.c_int * max(len(values), 1))(*values), len(values)


class _Run:
    """What a call of speculative iterations fills: the new tokens, and per iteration the drafts
    offered and stood and the ns spent drafting and verifying (each iteration brings a token; at most
    `room`, or the k + 1 of an iteration past `enough` - 1)."""

    def __init__(self, room: int, enough: int, k: int):
        cap = max(min(room, enough + k), 1)
        self.tokens, self.drafted, self.accepted = ((ctypes.c_int * cap)() for _ in range(3))
        self.draft_ns, self.verify_ns = (ctypes.c_int64 * cap)(), (ctypes.c_int64 * cap)()
        self.outputs = (self.tokens, self.drafted, self.accepted, self.draft_ns, self.verify_ns)

    def iterations(self, n: int) -> list[tuple]:
        """The first n iterations as (drafts offered, drafts stood, new tokens, draft s, verify s)."""
        out, at = [], 0
        for i in range(n):
            new = list(self.tokens[at : at + self.accepted[i] + 1])
            at += len(new)
            out.append((self.drafted[i], self.accepted[i], new, self.draft_ns[i] / 1e9, self.verify_ns[i] / 1e9))
        return out


SIGNATURES = {
    "speclite_cat": [_P, _P, _I, ctypes.c_int64, _P],
    "speclite_embed": [_P, _I, _P, _I, _I, _P, _I],
    "speclite_rms_norm": [_P, _P, _P, _I, _I, _I, _F],
    "speclite_swiglu": [_P, _P, _I, _I, _I],
    "speclite_attention": [_P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _I, _F, _P, _F, _I],
    "speclite_decoder_layers": [_P, _I, _P, _P, _P, _P, _P, _P, _I, _I, _P, _P, _P, _I, _I, _I, _F,
                                ctypes.POINTER(Head), _I, _P, _P, _I],
    "speclite_chain": [_P, _I, ctypes.POINTER(Head), _P, _I, _I, _P, _P, _I, _P, _P, _I, _I, _F, _I, _P, _P, _P, _I,
                       ctypes.POINTER(ctypes.c_int), _P, _P, _I],
    "speclite_head_chain": [ctypes.POINTER(Layer), ctypes.POINTER(Head), _P, _I, _P, ctypes.POINTER(ctypes.c_int), _I,
                            _P, _P, _P, _I, _P, _P, _I, _I, _F, _I, _I, ctypes.POINTER(ctypes.c_int), _I],
    "speclite_draft_iterations": [ctypes.POINTER(Decoder), ctypes.POINTER(Decoder), _I, _I, _I, _P, _I, _I, _I, _I,
                                  _I, _I, _I, _P, _P, _I, _P, _I, ctypes.c_int64, _P, _P, _P, _P, _P, _P, _I],
    "speclite_head_iterations": [ctypes.POINTER(Decoder), ctypes.POINTER(Layer), ctypes.POINTER(Head), _P,
                                 ctypes.POINTER(Matrices), _P, _I, _P, _P, _P, _P, _I, _F, _I, _I, _I, _I, _P, _I, _P, _I,
                                 _I, _I, _I, _P, _P, _I, _P, _I, ctypes.c_int64, _P, _P, _P, _P, _P, _P, _P, _I],
    "speclite_dflash_iterations": [ctypes.POINTER(Decoder), ctypes.POINTER(Decoder), _P, ctypes.POINTER(Matrices), _P,
                                   _F, _P, _I, _I, _I, _I, _I, _I, _P, _I, _I, _I, _I, _P, _P, _I, _P, _I,
                                   ctypes.c_int64, _P, _P, _P, _P, _P, _P, _P, _I],
}


def _library():
    return cpu_build.load("kernels.cpp", SIGNATURES)
