"""Run token windows through a checkpoint one decoder block at a time (calibration, perplexity).

Only the embeddings, one block's weights and one block's activations (every window's hidden
states at that block's input) are in memory at once, whatever the model's depth.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from speclite.model.decoder import Block, ModelArgs, RMSNorm, rope_inv_freq, rope_tables
from speclite.model.kv_cache import KVCache
from speclite.quant.source import TensorSource


class BlockRunner:
    def __init__(self, source: TensorSource, args: ModelArgs, dtype: torch.dtype, device: torch.device,
                 qconfig: dict | None = None):
        self.source, self.args, self.dtype, self.device, self.qconfig = source, args, dtype, device, qconfig
        inv_freq, self.rope_scale = rope_inv_freq(args)
        self.inv_freq = inv_freq.to(device)

    def embed(self, windows: list[torch.Tensor]) -> list[torch.Tensor]:
        table = self._dense("model.embed_tokens.weight")
        return [F.embedding(w.to(self.device), table) for w in windows]

    def block(self, i: int) -> Block:
        """Block i with its weights (quantized linears where the checkpoint has them)."""
        prefix = f"model.layers.{i}."
        tensors = {n[len(prefix):]: self.source.get(n) for n in self.source.layer_names(i)}
        with torch.device("meta"):
            block = Block(self.args)
        if self.qconfig:
            from speclite.quant.checkpoint import load_quantized_linears

            load_quantized_linears(block, self.qconfig, tensors, self.dtype, self.device)
        for name, param in list(block.named_parameters()):
            if param.device.type == "meta":
                module_name, _, attr = name.rpartition(".")
                value = tensors[name].to(device=self.device, dtype=self.dtype, copy=True)
                setattr(block.get_submodule(module_name), attr, torch.nn.Parameter(value, requires_grad=False))
        return block.eval()

    def run(self, block: Block, hidden: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every window through one block (each window from position 0, causal), as the full model does."""
        out = []
        with torch.no_grad():
            for x in hidden:
                t = x.shape[0]
                cache = KVCache(1, self.args.num_kv_heads, t, self.args.head_dim, self.dtype, self.device)
                out.append(block(x, *self._rope(t, x.dtype), cache.layers[0], 0, self._mask(t)))
        return out

    def perplexity(self, hidden: list[torch.Tensor], windows: list[torch.Tensor]) -> float:
        """The final norm and the output head over the last block's hidden states."""
        with torch.device("meta"):
            norm = RMSNorm(self.args.hidden_size, self.args.rms_norm_eps)
        norm.weight = torch.nn.Parameter(self._dense("model.norm.weight"), requires_grad=False)
        head_name = "model.embed_tokens.weight" if self.args.tie_word_embeddings else "lm_head.weight"
        head = self._dense(head_name)
        total, count = 0.0, 0
        with torch.no_grad():
            for x, w in zip(hidden, windows):
                logits = F.linear(norm(x[:-1]), head).float()
                total += F.cross_entropy(logits, w[1:].to(self.device), reduction="sum").item()
                count += w.numel() - 1
        return math.exp(total / count)

    def _dense(self, name: str) -> torch.Tensor:
        return self.source.get(name).to(device=self.device, dtype=self.dtype, copy=True)  # off the file map

    def _rope(self, t: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(torch.arange(t, device=self.device), self.inv_freq, self.rope_scale, dtype)

    def _mask(self, t: int) -> torch.Tensor:
        pos = torch.arange(t, device=self.device)
        mask = pos[None, :] <= pos[:, None]
        if self.args.sliding_window is not None:
            mask &= pos[None, :] > pos[:, None] - self.args.sliding_window
        return mask
