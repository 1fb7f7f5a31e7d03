"""Published DFlash drafters (z-lab/*-DFlash*, `architectures: ["DFlashDraftModel"]`) -> a DFlashDraft checked against its target.

The layout: a Qwen3 config at the top level plus `dflash_config.{target_layer_ids, block_size,
mask_token_id}` (older configs keep some of them at the top level, which is read second);
tensors `fc.weight`, `hidden_norm.weight`, `layers.N.*` (Qwen3 blocks with q/k norms) and
`norm.weight`; no embedding or lm_head: the target's are used. `target_layer_ids` name layers
whose *outputs* are read (the reference reads hidden_states[id + 1]). All layers attend without a
causal mask; sliding-window layers (`layer_types`) and DFlash2's extra modules are not run.
"""

from __future__ import annotations

from pathlib import Path

import torch

from speclite.errors import SpecliteError
from speclite.model.decoder import ModelArgs
from speclite.model.loader import _load_dense, read_config, read_tensors
from speclite.speculate.dflash.draft import DFlashDraft

ARCHITECTURE = "DFlashDraftModel"
DEFAULT_BLOCK_SIZE = 16  # the reference's default when a config names none


def _value(cfg: dict, key: str):
    own = cfg.get("dflash_config") or {}
    return own[key] if own.get(key) is not None else cfg.get(key)


def parse_config(cfg: dict, where: str, mask_option: int | None) -> tuple[dict, tuple[int, ...], int, int]:
    """(layer config, target layer ids, block size, mask token) of a DFlash config."""
    archs = cfg.get("architectures") or []
    if ARCHITECTURE not in archs:
        name = archs[0] if archs else cfg.get("model_type", "unknown")
        raise SpecliteError(f"{where} is not a DFlash drafter (architecture '{name}'): expected {ARCHITECTURE}")
    kinds = set(cfg.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"} or cfg.get("is_causal"):
        raise SpecliteError(f"{where}: speclite runs DFlash layers of full, non-causal attention, this drafter has "
                            f"{', '.join(sorted(kinds))}{' (causal)' if cfg.get('is_causal') else ''}")
    ids = _value(cfg, "target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise SpecliteError(f"{where}: dflash_config.target_layer_ids must be a non-empty list of layer indices, got {ids!r}")
    block = _value(cfg, "block_size") or DEFAULT_BLOCK_SIZE
    if not isinstance(block, int) or block < 2:
        raise SpecliteError(f"{where}: dflash_config.block_size must be an integer of at least 2, got {block!r}")
    mask = mask_option if mask_option is not None else _value(cfg, "mask_token_id")
    if mask is None:
        raise SpecliteError(f"DFlash drafter {where} names no mask token (config.json has no "
                            "dflash_config.mask_token_id): pass --mask-token-id")
    layer = dict(cfg, architectures=["Qwen3ForCausalLM"], tie_word_embeddings=False)  # Qwen3 blocks, whatever the target
    return layer, tuple(ids), block, mask


def check_fits(args: ModelArgs, ids: tuple[int, ...], mask, target: ModelArgs, where: str) -> None:
    """A drafter built for another target is a one-line error."""
    if args.hidden_size != target.hidden_size:
        raise SpecliteError(f"DFlash drafter {where} has hidden size {args.hidden_size} but the target's is "
                            f"{target.hidden_size}")
    if args.vocab_size != target.vocab_size:
        raise SpecliteError(f"DFlash drafter {where} was built for a vocabulary of {args.vocab_size} tokens, "
                            f"the target has {target.vocab_size}")
    if not all(0 <= i < target.num_layers for i in ids):
        raise SpecliteError(f"DFlash drafter {where} reads target layers {list(ids)}: the target has "
                            f"{target.num_layers} layers (0..{target.num_layers - 1})")
    if not isinstance(mask, int) or isinstance(mask, bool) or not 0 <= mask < target.vocab_size:
        raise SpecliteError(f"DFlash mask token {mask!r} of {where} is not a token id of the target "
                            f"(its vocabulary has {target.vocab_size} rows)")


def load_drafter(draft_dir: str | Path, target: ModelArgs, device, dtype, mask_option: int | None = None) -> DFlashDraft:
    draft_dir = Path(draft_dir)
    layer, ids, block, mask = parse_config(read_config(draft_dir), str(draft_dir), mask_option)
    try:
        args = ModelArgs.from_hf(layer)
    except KeyError as e:
        raise SpecliteError(f"{draft_dir}: the DFlash config lacks {e}") from None
    check_fits(args, ids, mask, target, str(draft_dir))
    tensors = {}
    for name, value in read_tensors(draft_dir).items():
        if not name.startswith(("layers.", "fc.", "hidden_norm.", "norm.")):
            raise SpecliteError(f"{draft_dir}: unexpected tensor '{name}' in a DFlash drafter")
        tensors["model." + name] = value
    with torch.device("meta"):
        draft = DFlashDraft(args, ids, block, mask)
    _load_dense(draft, tensors, dtype, device, draft_dir)
    draft.init_rope(device)
    return draft.eval()
