"""Published MTP modules -> an MTPModule checked against its target.

Two tensor layouts, found by name, in the target's own checkpoint or in a separate directory
(--draft, the RTP-LLM / PaddleNLP way; its config.json gives the block's shape):
- DeepSeek-V3: `model.layers.{L}.enorm / hnorm / eh_proj / shared_head.norm / shared_head.head`
  beside the block's usual tensors at the same prefix, L = num_hidden_layers for the first module
  (config `num_nextn_predict_layers` counts them). The per-module `embed_tokens` copy is the
  target's embedding and stays unread.
- MiMo: `model.mtp_layers.{i}.token_layernorm / hidden_layernorm / input_proj / final_layernorm`
  beside the block's tensors; no head of its own (the target's lm_head).
Only the first module is loaded: chaining feeds it its own output (as vLLM does for k > 1).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import torch

from speclite.errors import SpecliteError
from speclite.model.decoder import ModelArgs
from speclite.model.loader import _load_dense, beyond_decoder, read_config, read_tensors
from speclite.speculate.mtp.module import MTPModule

DEEPSEEK = re.compile(r"(model\.layers\.(\d+)\.)eh_proj\.weight$")
MIMO = re.compile(r"(model\.mtp_layers\.(\d+)\.)input_proj\.weight$")
# Checkpoint names after the module's prefix -> MTPModule's; anything else is the block's.
RENAMES = {
    "deepseek": {"shared_head.norm.": "model.norm.", "shared_head.head.": "lm_head."},
    "mimo": {"token_layernorm.": "model.layers.0.enorm.", "hidden_layernorm.": "model.layers.0.hnorm.",
             "input_proj.": "model.layers.0.eh_proj.", "final_layernorm.": "model.norm."},
}
UNUSED = ("embed_tokens.",)  # DeepSeek-V3 ships the shared embedding once more per module


def load_module(module_dir: str | Path, target, in_target: bool) -> MTPModule:
    """The first MTP module of `module_dir` (the target's own checkpoint when `in_target`), on the
    target's device and dtype, sharing its lm_head when it has no head of its own."""
    module_dir = Path(module_dir)
    where = f"the target's checkpoint {module_dir}" if in_target else str(module_dir)
    n = target.args.num_layers
    tensors = read_tensors(module_dir, (lambda name: beyond_decoder(name, n)) if in_target else None)
    layout, prefix = _find(tensors, where)
    try:
        args = replace(ModelArgs.from_hf(read_config(module_dir)), num_layers=1, tie_word_embeddings=False)
    except KeyError as e:
        raise SpecliteError(f"{where}: the MTP module's config lacks {e}") from None
    _check_fits(args, target.args, where)
    renamed = {}
    for name, value in tensors.items():
        if not name.startswith(prefix) or name[len(prefix):].startswith(UNUSED):
            continue
        rest = name[len(prefix):]
        new = next((to + rest[len(frm):] for frm, to in RENAMES[layout].items() if rest.startswith(frm)), None)
        renamed[new or "model.layers.0." + rest] = value
    own_head = "lm_head.weight" in renamed
    with torch.device("meta"):
        module = MTPModule(args, own_head, state_first=layout == "mimo", normed_state=layout == "mimo")
    device, dtype = target.model.norm.weight.device, target.dtype  # the activations' (a table may be 16-bit)
    _load_dense(module, renamed, dtype, device, module_dir)
    if not own_head:
        module.shared.append(target.lm_head)
    module.target_ids = torch.arange(args.vocab_size, device=device)
    module.init_rope(device)
    return module.eval()


def holds_module(model_dir: str | Path) -> bool:
    """Whether a checkpoint holds an MTP module of either layout (reads its projection only)."""
    return bool(read_tensors(Path(model_dir), lambda name: bool(DEEPSEEK.match(name) or MIMO.match(name))))


def _find(tensors: dict, where: str) -> tuple[str, str]:
    """(layout, name prefix) of the first module: the lowest index of either layout."""
    found = []
    for layout, pattern in (("deepseek", DEEPSEEK), ("mimo", MIMO)):
        for name in tensors:
            m = pattern.match(name)
            if m:
                found.append((int(m.group(2)), layout, m.group(1)))
    if not found:
        raise SpecliteError(f"{where} holds no MTP module (model.layers.N.eh_proj.* or "
                            "model.mtp_layers.N.input_proj.* tensors): pass one with --draft DIR")
    _, layout, prefix = min(found)
    return layout, prefix


def _check_fits(args: ModelArgs, target: ModelArgs, where: str) -> None:
    if args.hidden_size != target.hidden_size:
        raise SpecliteError(f"MTP module in {where} has hidden size {args.hidden_size} but the target's is "
                            f"{target.hidden_size}")
    if args.vocab_size != target.vocab_size:
        raise SpecliteError(f"MTP module in {where} predicts over {args.vocab_size} tokens, the target has "
                            f"{target.vocab_size}")
