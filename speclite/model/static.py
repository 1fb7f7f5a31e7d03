"""Static-shape decode steps: each token count captured once in a CUDA graph, then replayed.

At batch 1 a forward is hundreds of small kernel launches; replaying a captured graph costs one
launch. Decode (1 token) and verification (k+1 tokens) have fixed shapes, so each is captured the
first time it is seen for this cache; other shapes (prefill) run the ordinary dynamic forward.
Off CUDA the same static forward runs eagerly (useful to check it against the dynamic one).
"""

from __future__ import annotations

import torch

from speclite.errors import SpecliteError
from speclite.model.decoder import Transformer
from speclite.model.kv_cache import KVCache


class StaticDecoder:
    """Callable like Transformer.forward(tokens, cache, num_logits), bound to one cache."""

    def __init__(self, model: Transformer, cache: KVCache, max_tokens: int = 16):
        self.model, self.cache, self.max_tokens = model, cache, max_tokens
        self.args = model.args
        self.graphs: dict[int, tuple] = {}  # token count -> (graph, tokens, pos, logits)
        self.use_graphs = cache.layers[0][0].device.type == "cuda"

    def new_cache(self, max_len: int) -> KVCache:
        return self.model.new_cache(max_len)

    def __call__(self, tokens: torch.Tensor, cache: KVCache, num_logits: int | None = None) -> torch.Tensor:
        t, start = tokens.shape[0], cache.length
        if cache is not self.cache or t > self.max_tokens or t == 0:
            return self.model(tokens, cache, num_logits)
        if start + t > cache.max_len:
            raise SpecliteError(f"sequence of {start + t} tokens exceeds the context of {cache.max_len}")
        pos = torch.arange(start, start + t, device=tokens.device)
        if self.use_graphs:
            logits = self._replay(tokens, pos)
        else:
            logits = self.model.forward_static(tokens, pos, cache)
        cache.length = start + t
        return logits if num_logits is None else logits[-num_logits:]

    def _replay(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[0]
        if t not in self.graphs:
            self.graphs[t] = self._capture(tokens, pos)
        graph, static_tokens, static_pos, logits = self.graphs[t]
        static_tokens.copy_(tokens)
        static_pos.copy_(pos)
        graph.replay()
        return logits.clone()  # the next replay overwrites the output buffer

    def _capture(self, tokens: torch.Tensor, pos: torch.Tensor):
        static_tokens, static_pos = tokens.clone(), pos.clone()
        # Warm up on a side stream (lazy initialisation, kernel autotuning) before capturing.
        # The warm-up writes KV at `pos`, which the real replay rewrites with the same values.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.model.forward_static(static_tokens, static_pos, self.cache)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.model.forward_static(static_tokens, static_pos, self.cache)
        return graph, static_tokens, static_pos, logits
