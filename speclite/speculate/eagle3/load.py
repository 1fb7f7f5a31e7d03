"""Published EAGLE-3 heads -> an Eagle3Head checked against its target.

Two layouts load:
- SafeAILab / SpecForge (`architectures: ["LlamaForCausalLMEagle3"]`): a Llama config at the top
  level plus `draft_vocab_size`; tensors `fc.*`, `midlayer.*`, `norm.*`, `lm_head.*`, `d2t`, `t2d`.
  Its `eagle_config.eagle_aux_hidden_state_layer_ids` count the *outputs* of layers when the first
  id is 1 (SGLang adds one to them then, sglang#25454), else the inputs.
- vLLM speculators (`architectures: ["Eagle3Speculator"]`): the layer's config under
  `transformer_layer_config`, `eagle_aux_hidden_state_layer_ids` at the top level (inputs of
  those layers, vLLM's convention), tensors `layers.0.*` instead of `midlayer.*`.
Neither carries an embedding that speclite uses: the target's is shared. Without named layers
the head reads the inputs of target layers (2, L // 2, L - 3), as vLLM and SGLang do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from speclite.errors import SpecliteError
from speclite.model.decoder import ModelArgs
from speclite.model.loader import _load_dense, read_config, read_tensors
from speclite.speculate.eagle3.head import Eagle3Head

SPECFORGE = "LlamaForCausalLMEagle3"
SPECULATORS = "Eagle3Speculator"
LAYER_FAMILIES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM"}
# Checkpoint tensor-name prefixes -> Eagle3Head's module names.
PREFIXES = {"midlayer.": "model.layers.0.", "layers.0.": "model.layers.0.", "fc.": "model.fc.", "norm.": "model.norm.",
            "input_norm.": "model.input_norm.", "lm_head.": "lm_head."}
UNUSED = ("embed_tokens.", "verifier_", "t2d")  # the target's embedding is used; t2d is implied by d2t


@dataclass(frozen=True)
class HeadConfig:
    layout: str
    layer: dict  # the decoder layer's HF config
    draft_vocab: int
    target_vocab: int  # the vocabulary of the target the head was trained for
    target_hidden: int
    aux_layers: tuple[int, ...] | None  # inputs of these target layers; None = the default three
    norm_before_residual: bool
    norm_before_fc: bool


def is_head(cfg: dict) -> bool:
    """Whether a config.json is an EAGLE-3 head's (either layout)."""
    archs = cfg.get("architectures") or []
    return SPECULATORS in archs or "transformer_layer_config" in cfg or SPECFORGE in archs


def parse_config(cfg: dict, where: str) -> HeadConfig:
    archs = cfg.get("architectures") or []
    if not is_head(cfg):
        name = archs[0] if archs else cfg.get("model_type", "unknown")
        raise SpecliteError(f"{where} is not an EAGLE-3 head (architecture '{name}'): expected {SPECFORGE} or {SPECULATORS}")
    if SPECULATORS in archs or "transformer_layer_config" in cfg:
        layout, layer = "speculators", dict(cfg.get("transformer_layer_config") or {})
        ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    else:
        layout, layer = "specforge", dict(cfg)
        ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if ids and ids[0] == 1:
            ids = [i + 1 for i in ids]
    family = layer.get("model_type", "llama")
    if family not in LAYER_FAMILIES:
        raise SpecliteError(f"{where}: EAGLE-3 layer type '{family}' is not supported ({', '.join(LAYER_FAMILIES)} are)")
    if layer.get("num_hidden_layers", 1) != 1:
        raise SpecliteError(f"{where}: speclite runs one-layer EAGLE-3 heads, this one has {layer['num_hidden_layers']}")
    layer["architectures"] = [LAYER_FAMILIES[family]]
    try:
        vocab = int(layer["vocab_size"])
        hidden = int(layer["hidden_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise SpecliteError(f"{where}: EAGLE-3 config lacks {e}") from None
    return HeadConfig(
        layout=layout, layer=layer,
        draft_vocab=int(cfg.get("draft_vocab_size") or layer.get("draft_vocab_size") or vocab),
        target_vocab=vocab,
        target_hidden=int(cfg.get("target_hidden_size") or layer.get("target_hidden_size") or hidden),
        aux_layers=tuple(int(i) for i in ids) if ids else None,
        norm_before_residual=bool(cfg.get("norm_before_residual", layer.get("norm_before_residual", False))),
        norm_before_fc=bool(cfg.get("norm_before_fc", False)),
    )


def check_fits(hc: HeadConfig, target: ModelArgs, where: str) -> tuple[int, ...]:
    """The target layers to read; a head built for another target is a one-line error."""
    if hc.layer["hidden_size"] != target.hidden_size or hc.target_hidden != target.hidden_size:
        raise SpecliteError(f"EAGLE-3 head {where} has hidden size {hc.layer['hidden_size']} (target states "
                            f"{hc.target_hidden}) but the target's is {target.hidden_size}")
    if hc.target_vocab != target.vocab_size:
        raise SpecliteError(f"EAGLE-3 head {where} was built for a vocabulary of {hc.target_vocab} tokens, "
                            f"the target has {target.vocab_size}")
    if not 0 < hc.draft_vocab <= target.vocab_size:
        raise SpecliteError(f"EAGLE-3 head {where}: draft vocabulary of {hc.draft_vocab} does not fit the "
                            f"target's {target.vocab_size}")
    n = target.num_layers
    layers = hc.aux_layers or (2, n // 2, n - 3)
    if len(layers) != 3 or not all(0 <= i < n for i in layers):
        raise SpecliteError(f"EAGLE-3 head {where} reads target layers {list(layers)}: the target has {n} "
                            "layers and the head needs three of them")
    return layers


def load_head(head_dir: str | Path, target: ModelArgs, device, dtype) -> Eagle3Head:
    head_dir = Path(head_dir)
    hc = parse_config(read_config(head_dir), str(head_dir))
    layers = check_fits(hc, target, str(head_dir))
    try:
        args = replace(ModelArgs.from_hf(hc.layer), tie_word_embeddings=False)
    except KeyError as e:
        raise SpecliteError(f"{head_dir}: the EAGLE-3 layer config lacks {e}") from None
    tensors = {}
    for name, value in read_tensors(head_dir).items():
        if name == "d2t" or name.startswith(UNUSED):
            tensors[name] = value
            continue
        prefix = next((p for p in PREFIXES if name.startswith(p)), None)
        if prefix is None:
            raise SpecliteError(f"{head_dir}: unexpected tensor '{name}' in an EAGLE-3 head")
        tensors[PREFIXES[prefix] + name[len(prefix):]] = value
    with torch.device("meta"):
        head = Eagle3Head(args, hc.draft_vocab, 3 * hc.target_hidden, layers, hc.norm_before_residual,
                          hc.norm_before_fc)
    _load_dense(head, tensors, dtype, device, head_dir)
    head.target_ids = _target_ids(tensors.get("d2t"), hc, head_dir).to(device)
    head.init_rope(device)
    return head.eval()


def _target_ids(d2t: torch.Tensor | None, hc: HeadConfig, where: Path) -> torch.Tensor:
    """Target token id of every draft id: draft_id + d2t[draft_id] (the identity without d2t)."""
    ids = torch.arange(hc.draft_vocab)
    if d2t is None:
        if hc.draft_vocab != hc.target_vocab:
            raise SpecliteError(f"{where}: a draft vocabulary of {hc.draft_vocab} needs a d2t tensor")
        return ids
    if tuple(d2t.shape) != (hc.draft_vocab,) or d2t.is_floating_point():
        raise SpecliteError(f"{where}: d2t must be integer offsets of shape ({hc.draft_vocab},), got "
                            f"{d2t.dtype} {tuple(d2t.shape)}")
    ids = ids + d2t.long()
    if ids.min() < 0 or ids.max() >= hc.target_vocab or ids.unique().numel() != ids.numel():
        raise SpecliteError(f"{where}: d2t maps draft ids outside the target vocabulary of {hc.target_vocab} "
                            "or onto the same target id twice")
    return ids
