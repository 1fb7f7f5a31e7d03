"""Static-shape decode steps: each token count captured once in a CUDA graph, then replayed.

At batch 1 a forward is hundreds of small kernel launches; replaying a captured graph costs one
launch. Decode (1 token) and verification (k+1 tokens, a chain or a tree) have fixed shapes, so
each is captured the first time it is seen for this cache; other shapes (prefill) run the
ordinary dynamic forward.
Off CUDA the same static forward runs eagerly (useful to check it against the dynamic one).
"""

from __future__ import annotations

import torch

from speclite.errors import SpecliteError
from speclite.model.decoder import Transformer
from speclite.model.kv_cache import KVCache
from speclite.model.step import NOTHING, Step, Tree, Wants


# A step's mask spans the cache's first `span` keys, the next power of two above the sequence (at least
# MIN_SPAN), a graph per span. The GPU attention kernel reads no key past the sequence whatever the
# span; the span sizes the mask written each step and the kernel's grid (chunks past the sequence exit
# at once). SDPA read the whole span: one graph for a 32k context read Qwen2.5-7B's 1.9 GB of keys and
# values a step beside 15 GB of weights.
MIN_SPAN = 256


class StaticDecoder:
    """Callable like Transformer (forward and step), bound to one cache.

    A graph is captured per (token count, wants, span): a chain and a tree of the same size share
    it, since positions, cache slots and the tree mask are all inputs.
    """

    def __init__(self, model: Transformer, cache: KVCache, max_tokens: int = 16):
        self.model, self.cache, self.max_tokens = model, cache, max_tokens
        self.args = model.args
        self.graphs: dict[tuple, tuple] = {}  # (token count, wants, span) -> (graph, inputs, output Step)
        self.use_graphs = cache.layers[0][0].device.type == "cuda"

    def new_cache(self, max_len: int) -> KVCache:
        return self.model.new_cache(max_len)

    def __call__(self, tokens: torch.Tensor, cache: KVCache, num_logits: int | None = None) -> torch.Tensor:
        return self.step(tokens, cache, num_logits).logits

    def greedy_chain(self, token: int, cache: KVCache, steps: int, vocab: int) -> None:
        """Declines (see Transformer.greedy_chain): a static draft then runs its fixed-shape steps one
        by one, each a graph replay on CUDA."""
        return None

    def chain(self, token: int, cache: KVCache, steps: int, vocab: int, params, generator,
              wants: Wants = NOTHING) -> None:
        """Declines (see Transformer.chain), drawing nothing: plain decoding then runs its fixed-shape
        steps one by one, each a graph replay on CUDA."""
        return None

    def kernel_decoder(self, cache: KVCache) -> None:
        """Declines (see Transformer.kernel_decoder): the fixed-shape steps run one by one."""
        return None

    def step(self, tokens: torch.Tensor, cache: KVCache, num_logits: int | None = None, tree: Tree | None = None,
             wants: Wants = NOTHING) -> Step:
        t, start = tokens.shape[0], cache.length
        if cache is not self.cache or t > self.max_tokens or t == 0:
            return self.model.step(tokens, cache, num_logits, tree, wants)
        if start + t > cache.max_len:
            raise SpecliteError(f"sequence of {start + t} tokens exceeds the context of {cache.max_len}")
        device = tokens.device
        slots = torch.arange(start, start + t, device=device)
        if tree is None:
            pos, mask = slots, torch.ones(t, t, dtype=torch.bool, device=device).tril()
        else:
            pos, mask = start + tree.depth, tree.mask
        inputs = (tokens, pos, slots, mask)
        span = min(cache.max_len, max(MIN_SPAN, 1 << (start + t - 1).bit_length()))
        if self.use_graphs:
            step = self._replay(inputs, wants, span)
        else:
            step = self.model.forward_static(*inputs, cache, wants, span)
        cache.length = start + t
        if num_logits is not None:
            step.logits = step.logits[-num_logits:]
        return step

    def _replay(self, inputs: tuple, wants: Wants, span: int) -> Step:
        key = (inputs[0].shape[0], wants, span)
        if key not in self.graphs:
            self.graphs[key] = self._capture(inputs, wants, span)
        graph, static_inputs, out = self.graphs[key]
        for dst, src in zip(static_inputs, inputs):
            dst.copy_(src)
        graph.replay()
        # The next replay overwrites the output buffers.
        return Step(out.logits.clone(), None if out.final is None else out.final.clone(),
                    {i: h.clone() for i, h in out.layers.items()})

    def _capture(self, inputs: tuple, wants: Wants, span: int):
        static_inputs = tuple(x.clone() for x in inputs)
        # Warm up on a side stream (lazy initialisation, kernel autotuning) before capturing.
        # The warm-up writes KV at the slots, which the real replay rewrites with the same values.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.model.forward_static(*static_inputs, self.cache, wants, span)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.model.forward_static(*static_inputs, self.cache, wants, span)
        return graph, static_inputs, out
