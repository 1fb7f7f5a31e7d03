"""Tiny random models (saved with transformers) and a tiny tokenizer for the quantization tests."""

from __future__ import annotations

from pathlib import Path

import torch
from speclite.quant import QuantProgress
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


class Recorder(QuantProgress):
    """Everything quantize_to_dir reports: notes, and the tensors with their byte counts."""

    def __init__(self):
        self.notes, self.tensors, self.total = [], [], None

    def start(self, tensors, nbytes):
        self.total = (tensors, nbytes)

    def tensor(self, name, nbytes):
        self.tensors.append((name, nbytes))

    def note(self, message):
        self.notes.append(message)


def save_random_checkpoint(path: Path, hidden: int, intermediate: int, layers: int, vocab: int = 512,
                           seed: int = 0) -> Path:
    """A Qwen2-shaped bf16 checkpoint written tensor by tensor (no model in memory), no tokenizer."""
    import json

    from safetensors.torch import save_file

    path.mkdir(parents=True)
    heads = max(1, hidden // 64)
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": vocab,
              "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": heads, "tie_word_embeddings": True,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}
    (path / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return (0.02 * torch.randn(*shape, generator=gen)).bfloat16()

    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (hidden, hidden),
              "self_attn.v_proj": (hidden, hidden), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (intermediate, hidden), "mlp.up_proj": (intermediate, hidden),
              "mlp.down_proj": (hidden, intermediate)}
    save_file({"model.embed_tokens.weight": rand(vocab, hidden), "model.norm.weight": 1 + rand(hidden)},
              str(path / "model-00000.safetensors"))
    for i in range(layers):  # one shard per block keeps the writer's own memory to one block
        block = {f"model.layers.{i}.{n}.weight": rand(*s) for n, s in shapes.items()}
        block.update({f"model.layers.{i}.self_attn.{p}_proj.bias": rand(hidden) for p in "qkv"})
        block.update({f"model.layers.{i}.{n}.weight": 1 + rand(hidden) for n in ("input_layernorm", "post_attention_layernorm")})
        save_file(block, str(path / f"model-{i + 1:05d}.safetensors"))
    return path
