"""SGLang's EAGLE tree knobs, shared by the methods that draft with EAGLE-3's proposer (eagle3, mtp).

SGLang runs MTP (its NEXTN algorithm) through the same three knobs as EAGLE, so `--sp-type mtp`
takes the very options `eagle3` does (one Option each: the registry lets methods share one).
A chain of K is steps K and topk 1, the default, with K from --gen-num-per-cycle.
"""

from __future__ import annotations

from speclite.errors import SpecliteError
from speclite.speculate.registry import Option

TREE_OPTIONS = (
    Option("eagle_topk", int, 1, "EAGLE-3 / MTP tree: children per expanded node (1 = a chain)."),
    Option("eagle_steps", int, None,
           "EAGLE-3 / MTP tree: head passes, i.e. the tree's depth (default: the draft budget)."),
    Option("eagle_num_draft_tokens", int, None,
           "EAGLE-3 / MTP tree: tokens verified per pass, the last committed one included (default: k + 1)."),
)
LOWEST = {"eagle_topk": 1, "eagle_steps": 1, "eagle_num_draft_tokens": 2}


def check_tree(options: dict) -> None:
    for name, low in LOWEST.items():
        value = options[name]
        if value is not None and value < low:
            raise SpecliteError(f"--{name.replace('_', '-')} must be at least {low}, got {value}")
    if options["eagle_topk"] == 1 and options["eagle_num_draft_tokens"] is not None:  # it would be ignored
        raise SpecliteError("--eagle-num-draft-tokens sizes a tree (--eagle-topk 2 or more): a chain drafts "
                            "--gen-num-per-cycle tokens (at most --eagle-steps)")


def budget(proposer) -> int | None:
    """The most drafts an iteration of these knobs makes, the default k and its ceiling (None: k's own
    default, unbounded): a tree's --eagle-num-draft-tokens - 1, a chain's --eagle-steps."""
    if proposer.topk == 1:
        return proposer.steps
    return proposer.num_draft_tokens - 1 if proposer.num_draft_tokens else None


def tree_args(options: dict) -> dict:
    """Eagle3Proposer's tree keywords from the options."""
    return {"topk": options["eagle_topk"], "steps": options["eagle_steps"],
            "num_draft_tokens": options["eagle_num_draft_tokens"]}
