"""Published Medusa heads -> MedusaHeads checked against the target.

Two layouts load:
- FasterDecoding/Medusa: config.json with `medusa_num_heads`, `medusa_num_layers` (beside the base
  model's keys in Medusa-2 checkpoints); tensors in `medusa_lm_head.safetensors` or
  `medusa_lm_head.pt`, named `{i}.{j}.linear.weight/bias` (block j of head i) and
  `{i}.{num_layers}.weight` (head i's lm_head). Hidden size and vocabulary come from the tensors.
- vLLM (`model_type: "medusa"`): `num_heads`, `num_hidden_layers`, `hidden_size`, `vocab_size`;
  tensors `blocks.{i}.layers.{j}.weight` (+ `.bias` when `medusa_fc_bias`) and `lm_heads.{i}.weight`,
  or one shared `lm_head` when `original_lm_head` is set; with `original_lm_head` and no lm_head
  tensor at all, every head uses the target's own lm_head (the original one, never copied).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from speclite.errors import SpecliteError
from speclite.model.decoder import ModelArgs
from speclite.model.loader import _load_dense, read_config, read_tensors
from speclite.speculate.medusa.head import MedusaHeads

MEDUSA_PT = "medusa_lm_head.pt"
ORIGINAL = re.compile(r"(\d+)\.(\d+)\.(linear\.)?(weight|bias)")
VLLM_BLOCK = re.compile(r"blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)")
VLLM_HEAD = re.compile(r"lm_heads\.(\d+)\.weight")
SAVED_PREFIXES = ("medusa_heads.", "medusa_head.")  # trainers that save the heads inside a model


@dataclass(frozen=True)
class HeadConfig:
    layout: str  # "medusa" or "vllm"
    num_heads: int
    num_layers: int
    shared_lm_head: bool  # vLLM's original_lm_head: every head uses lm_heads.0


def parse_config(cfg: dict, where: str) -> HeadConfig:
    if "medusa_num_heads" in cfg:
        layout, heads, layers = "medusa", cfg["medusa_num_heads"], cfg.get("medusa_num_layers", 1)
    elif cfg.get("model_type") == "medusa":
        layout, heads, layers = "vllm", cfg.get("num_heads"), cfg.get("num_hidden_layers", 1)
        truncated = cfg.get("truncated_vocab_size")
        if truncated is not None and truncated != cfg.get("vocab_size"):
            raise SpecliteError(f"{where}: Medusa heads over a truncated vocabulary (token_map) are not supported")
    else:
        raise SpecliteError(f"{where} is not a Medusa head: config.json has no medusa_num_heads and its "
                            f"model_type is '{cfg.get('model_type', 'unknown')}', not 'medusa'")
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        raise SpecliteError(f"{where}: Medusa config needs a positive number of heads, got {heads}")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 0:
        raise SpecliteError(f"{where}: Medusa config needs a number of residual blocks >= 0, got {layers}")
    return HeadConfig(layout, heads, layers, bool(cfg.get("original_lm_head", False)))


def read_head_tensors(head_dir: Path) -> dict[str, torch.Tensor]:
    """safetensors (any name), else the Medusa repo's medusa_lm_head.pt."""
    pt = head_dir / MEDUSA_PT
    if pt.exists() and not any(head_dir.glob("*.safetensors")):
        try:
            tensors = torch.load(pt, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many kinds for a bad pickle
            raise SpecliteError(f"{pt} is not a readable state dict ({type(e).__name__}: {e})") from None
        if not isinstance(tensors, dict):
            raise SpecliteError(f"{pt} is not a state dict of tensors")
        return tensors
    return read_tensors(head_dir)


def module_names(tensors: dict, hc: HeadConfig, where: Path) -> dict[str, torch.Tensor]:
    """Checkpoint names -> MedusaHeads' (heads.{i}.layers.{j}.*, heads.{i}.lm_head.weight)."""
    out = {}
    for name, value in tensors.items():
        name = next((name[len(p):] for p in SAVED_PREFIXES if name.startswith(p)), name)
        if (m := ORIGINAL.fullmatch(name)) and hc.layout == "medusa":
            head, block, linear, kind = int(m[1]), int(m[2]), m[3], m[4]
            if block < hc.num_layers and linear:
                out[f"heads.{head}.layers.{block}.{kind}"] = value
                continue
            if block == hc.num_layers and not linear and kind == "weight":
                out[f"heads.{head}.lm_head.weight"] = value
                continue
        elif (m := VLLM_BLOCK.fullmatch(name)) and hc.layout == "vllm":
            out[f"heads.{m[1]}.layers.{m[2]}.{m[3]}"] = value
            continue
        elif (m := VLLM_HEAD.fullmatch(name)) and hc.layout == "vllm":
            out[f"heads.{m[1]}.lm_head.weight"] = value
            continue
        elif name == "lm_head.weight" and hc.shared_lm_head:
            out["heads.0.lm_head.weight"] = value
            continue
        raise SpecliteError(f"{where}: unexpected tensor '{name}' in a {hc.layout}-layout Medusa head "
                            f"of {hc.num_layers} residual block(s) per head")
    if hc.shared_lm_head and "heads.0.lm_head.weight" in out:
        for i in range(1, hc.num_heads):
            out[f"heads.{i}.lm_head.weight"] = out["heads.0.lm_head.weight"]
    return out


def check_fits(tensors: dict, hc: HeadConfig, target: ModelArgs, where: Path) -> None:
    """A head built for another target (hidden size, vocabulary) is a one-line error."""
    lm_head = tensors.get("heads.0.lm_head.weight")
    if lm_head is None and uses_target_head(tensors, hc):
        block = tensors.get("heads.0.layers.0.weight")
        if block is None or block.dim() != 2:
            raise SpecliteError(f"{where}: the Medusa head has neither residual blocks nor an lm_head of its own")
        if tuple(block.shape) != (target.hidden_size, target.hidden_size):
            raise SpecliteError(f"Medusa head {where} has blocks of shape {tuple(block.shape)} but the target's "
                                f"hidden size is {target.hidden_size}")
        return
    if lm_head is None or lm_head.dim() != 2:
        raise SpecliteError(f"{where}: the Medusa head has no lm_head for head 0")
    vocab, hidden = lm_head.shape
    if hidden != target.hidden_size:
        raise SpecliteError(f"Medusa head {where} has hidden size {hidden} but the target's is {target.hidden_size}")
    if vocab != target.vocab_size:
        raise SpecliteError(f"Medusa head {where} predicts over {vocab} tokens, the target's vocabulary has "
                            f"{target.vocab_size}")


def uses_target_head(tensors: dict, hc: HeadConfig) -> bool:
    """vLLM's original_lm_head with no lm_head in the checkpoint: the heads use the target's."""
    return hc.shared_lm_head and not any(".lm_head." in name for name in tensors)


def load_heads(head_dir: str | Path, target: ModelArgs, device, dtype) -> MedusaHeads:
    """The heads of head_dir; where they use the target's lm_head (uses_target_head) the caller
    appends it to `shared`."""
    head_dir = Path(head_dir)
    hc = parse_config(read_config(head_dir), str(head_dir))
    tensors = module_names(read_head_tensors(head_dir), hc, head_dir)
    check_fits(tensors, hc, target, head_dir)
    bias = any(name.endswith(".bias") for name in tensors)  # always in Medusa's; vLLM's medusa_fc_bias
    with torch.device("meta"):
        heads = MedusaHeads(target, hc.num_heads, hc.num_layers, bias, own_head=not uses_target_head(tensors, hc))
    _load_dense(heads, tensors, dtype, device, head_dir)
    if hc.shared_lm_head and heads.heads[0].lm_head is not None:  # one copy in memory, as in the checkpoint
        for head in heads.heads[1:]:
            head.lm_head.weight = heads.heads[0].lm_head.weight
    return heads.eval()
