"""`hybrid`: a model proposer drafts N tokens, then prompt lookup and suffix matching fill up to k.

The model part is a draft model (`vanilla`), an EAGLE-3 head or an MTP module, built by its own
method (a chain: EAGLE-3's tree options keep their defaults); the n-gram fillers are the
`deterministic` and `suffix` proposers, each continuing the sequence plus the drafts before it
(FastDeploy's MTP `with_ngram` strategy, extended to any model and to suffix matching). The
proposal names its parts, so the stats show acceptance per part.

Sampling stays lossless: a filler's draft is a deterministic function of the sequence and the
drafts before it, so its draft distribution given them is one-hot; the model's drafts carry their
warped distributions. The verifier gets those rows, then one-hot rows for the fillers.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from speclite.errors import SpecliteError
from speclite.model.loader import read_config
from speclite.model.step import NOTHING, Step
from speclite.speculate import prompt_lookup, suffix  # noqa: F401  (the fillers register before the hybrid reads them)
from speclite.speculate.base import Proposal, Proposer, RequestContext
from speclite.speculate.eagle3.load import is_head
from speclite.speculate.mtp.load import holds_module
from speclite.speculate import token_map
from speclite.speculate.registry import BuildContext, Method, Option, build_proposer, get_method, method_options, register

MODELS = ("vanilla", "eagle3", "mtp")
FILLERS = {"lookup": "deterministic", "suffix": "suffix"}  # --hybrid-fill name -> the method that drafts it


class HybridProposer(Proposer):
    name = "hybrid"

    def __init__(self, model: Proposer, fillers: dict[str, Proposer], steps: int, model_name: str = "model"):
        self.model, self.fillers, self.steps, self.model_name = model, fillers, steps, model_name
        self.wants = model.wants if steps else NOTHING  # N = 0: the model never drafts, needs no states

    def states_from(self, prompt_ids: list[int]) -> int:
        return self.model.states_from(prompt_ids)

    def begin(self, prompt_ids: list[int], ctx: RequestContext) -> None:
        for proposer in (self.model, *self.fillers.values()):
            proposer.begin(prompt_ids, ctx)

    def catch_up(self) -> None:
        self.model.catch_up()

    def propose(self, k: int) -> Proposal:
        head = self.model.propose(min(self.steps, k)) if self.steps and k else Proposal([])
        tokens, parts = list(head.tokens), [(self.model_name, len(head.tokens))]
        for name, filler in self.fillers.items():
            more = filler.propose_after(tokens, k - len(tokens)).tokens if len(tokens) < k else []
            tokens += more
            parts.append((name, len(more)))
        probs = head.probs
        if probs is not None and len(tokens) > len(head.tokens):
            ngram = torch.tensor(tokens[len(head.tokens):], device=probs.device)
            probs = torch.cat([probs, torch.nn.functional.one_hot(ngram, probs.shape[-1]).to(probs.dtype)])
        return Proposal(tokens, probs, parts=tuple(parts))

    def observe(self, tokens: list[int], states: Step | None = None) -> None:
        self.model.observe(tokens, states)
        for filler in self.fillers.values():
            filler.observe(tokens)

    def finish(self) -> None:
        for proposer in (self.model, *self.fillers.values()):
            proposer.finish()

    def reset(self) -> None:
        for proposer in (self.model, *self.fillers.values()):
            proposer.reset()

    def forget(self) -> None:
        for proposer in (self.model, *self.fillers.values()):
            proposer.forget()

    def use_static(self) -> None:
        self.model.use_static()

    def resident(self) -> tuple[list, list]:
        return self.model.resident()


def model_kind(options: dict, draft_dir: Path | None) -> str:
    """--hybrid-model, or what --draft is: an EAGLE-3 head, an MTP module, else a draft model;
    without --draft, the target's own MTP module."""
    if options["hybrid_model"]:
        return options["hybrid_model"]
    if draft_dir is None:
        return "mtp"
    if is_head(read_config(draft_dir)):
        return "eagle3"
    return "mtp" if holds_module(draft_dir) else "vanilla"


def _fills(options: dict) -> list[str]:
    return [name.strip() for name in options["hybrid_fill"].split(",") if name.strip()]


def _check(options: dict) -> None:
    if options["hybrid_model"] and options["hybrid_model"] not in MODELS:
        raise SpecliteError(f"--hybrid-model must be one of {', '.join(MODELS)}, got '{options['hybrid_model']}'")
    if options["hybrid_model_steps"] < 0:
        raise SpecliteError(f"--hybrid-model-steps must be at least 0, got {options['hybrid_model_steps']}")
    fills = _fills(options)
    bad = [name for name in fills if name not in FILLERS]
    if bad or len(set(fills)) != len(fills):
        raise SpecliteError(f"--hybrid-fill takes distinct names from {', '.join(FILLERS)}, "
                            f"got '{options['hybrid_fill']}'")
    for method in set(FILLERS.values()):
        get_method(method).check(options)


def _check_k(options: dict, k: int) -> None:
    if options["hybrid_model_steps"] > k:
        raise SpecliteError(f"--hybrid-model-steps ({options['hybrid_model_steps']}) must not exceed "
                            f"--gen-num-per-cycle ({k})")


def _own(method: str, ctx: BuildContext) -> BuildContext:
    """`ctx` with `method`'s own options (the hybrid's values where it shares them, else defaults)."""
    names = {o.name for o in get_method(method).options}
    return replace(ctx, options=method_options(method, {n: v for n, v in ctx.options.items() if n in names}))


def _build(ctx: BuildContext) -> HybridProposer:
    kind = model_kind(ctx.options, ctx.draft_dir)
    if kind != "mtp" and ctx.draft_dir is None:
        raise SpecliteError(f"--sp-type hybrid --hybrid-model {kind} needs --draft")
    own_module = ctx.target.checkpoint_dir is not None and holds_module(ctx.target.checkpoint_dir)
    if kind == "mtp" and ctx.draft_dir is None and not own_module:
        raise SpecliteError("--sp-type hybrid needs --draft (a draft model, an EAGLE-3 head or an MTP module) "
                            "when the target has no MTP module")
    model = build_proposer(kind, _own(kind, ctx))
    fillers = {name: build_proposer(FILLERS[name], _own(FILLERS[name], ctx)) for name in _fills(ctx.options)}
    return HybridProposer(model, fillers, ctx.options["hybrid_model_steps"], kind)


register(Method(
    "hybrid", _build,
    "a model proposer (draft model, EAGLE-3 head or MTP module) drafts N tokens, n-gram matches fill up to k",
    options=(
        Option("hybrid_model_steps", int, 1, "Drafts of the model part per iteration (N <= --gen-num-per-cycle).",
               "--hybrid-model-steps"),
        Option("hybrid_model", str, "", "The model part: vanilla, eagle3 or mtp (default: what --draft is; "
               "without --draft, the target's MTP module).", "--hybrid-model"),
        Option("hybrid_fill", str, "lookup,suffix", "What fills the drafts after the model's, in order: "
               "lookup (prompt lookup), suffix (suffix matching).", "--hybrid-fill"),
        *get_method("deterministic").options,
        *get_method("suffix").options,
        token_map.TOKEN_MAP,  # the model part's
    ),
    draft_is_model=lambda options, draft_dir: model_kind(options, draft_dir) == "vanilla",
    draft_optional=True, needs_target=True, check=_check, check_k=_check_k, in_default_sweep=False,
    draft_method=lambda options: options.get("hybrid_model") or "hybrid",
))
