"""Random-weight target/draft directories of real shapes for the bench, each with a tokenizer.

Per-forward latency, memory and loop overhead depend on shapes only. The models need a
tokenizer to run through the LLM API: the embedded tiny-code one when it is installed, else a
small byte-level BPE trained here on the bench prompts (no download either way). Ids past the
tokenizer's vocabulary decode to nothing, which is fine for timing.
"""

from __future__ import annotations

from pathlib import Path

import torch

from speclite.bench.prompts import BUILTIN
from speclite.hub import load_registry
from speclite.synthetic import build_synthetic

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def embedded_tokenizer_dir() -> Path | None:
    alias = load_registry().aliases.get("tiny-code")
    if alias is not None and alias.path is not None and (alias.path / "tokenizer_config.json").exists():
        return alias.path
    return None


def make_tokenizer(out_dir: Path, vocab_size: int = 512) -> Path:
    """A byte-level BPE (ChatML specials, chat template) trained on the built-in prompts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = []
    for p in BUILTIN:
        texts.append(p.prompt if isinstance(p.prompt, str) else " ".join(m["content"] for m in p.prompt))
        texts.extend(v for v in p.extra.values() if isinstance(v, str))
    tok.train_from_iterator(texts * 4, trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=CHAT_TEMPLATE, eos_token="<|im_end|>",
                                      pad_token="<|endoftext|>")
    wrapped.save_pretrained(out_dir)
    return out_dir


def build_pair(root: Path, target: str, draft: str | None, layers: int | None, dtype: torch.dtype,
               draft_layers: int | None = None, device="cpu") -> tuple[Path, Path | None, str]:
    """(target_dir, draft_dir or None, where the tokenizer came from); the random numbers drawn on
    `device` (the run's: a GPU draws them fastest)."""
    tokenizer_dir = embedded_tokenizer_dir()
    source = "tiny-code"
    if tokenizer_dir is None:
        tokenizer_dir = make_tokenizer(root / "tokenizer")
        source = "a small BPE trained on the bench prompts"
    target_dir = build_synthetic(target, root / "target", layers=layers, dtype=dtype, seed=0, tokenizer_from=tokenizer_dir,
                                 device=device)
    draft_dir = None
    if draft:
        draft_dir = build_synthetic(draft, root / "draft", layers=draft_layers, dtype=dtype, seed=1,
                                    tokenizer_from=tokenizer_dir, device=device)
    return target_dir, draft_dir, source
