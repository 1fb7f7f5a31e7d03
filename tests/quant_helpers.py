"""Tiny random models (saved with transformers) and a tiny tokenizer for the quantization tests."""

from __future__ import annotations

from pathlib import Path

import torch
from speclite.quant.calib import SHIPPED_CALIB


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<eos>"])
    tok.train_from_iterator([SHIPPED_CALIB.read_text()[:20000]], trainer)
    # A pad token inside the vocabulary: GPTQModel otherwise appends one past the embedding table.
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


def save_tiny_model(path: Path, hidden=64, intermediate=160, heads=4, kv_heads=2, seed=0, tie=True,
                    family="qwen2", outliers=False) -> Path:
    """A Qwen2 (q/k/v bias) or Llama tiny model with random weights, saved with its tokenizer.

    `outliers` scales a few hidden channels of every RMSNorm weight up, as in real LLMs, so
    activation outliers exist for SmoothQuant to act on.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    torch.manual_seed(seed)
    cls = Qwen2Config if family == "qwen2" else LlamaConfig
    config = cls(vocab_size=300, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
                 num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=tie,
                 max_position_embeddings=512)
    model = AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
                if outliers:
                    p[:: max(1, p.numel() // 4)] *= 20
            elif p.dim() == 1:
                p.copy_(0.02 * torch.randn_like(p))
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens, model.new_cache(tokens.numel())).float()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()
