"""Speculation methods: which proposer a --sp-type names, and building it."""

from __future__ import annotations

from speclite.errors import SpecliteError
from speclite.spec.base import Proposal, Proposer, RequestContext

METHODS = ("none", "naive", "vanilla", "deterministic")
# vLLM / other tools' names for the same methods.
ALIASES = {"draft_model": "vanilla", "draft": "vanilla", "ngram": "deterministic", "prompt_lookup": "deterministic"}


def normalize_method(name: str | None) -> str:
    method = ALIASES.get((name or "none").lower(), (name or "none").lower())
    if method not in METHODS:
        raise SpecliteError(f"unknown speculation method '{name}': choose from {', '.join(METHODS)}")
    return method


def needs_draft_model(method: str) -> bool:
    return method == "vanilla"


def build_proposer(cfg, draft_model, max_len: int, target_vocab: int) -> Proposer:
    """The proposer for a validated SpecConfig (method other than none)."""
    if cfg.method == "naive":
        from speclite.spec.naive import NaiveProposer

        return NaiveProposer()
    if cfg.method == "vanilla":
        from speclite.spec.draft_model import DraftModelProposer

        return DraftModelProposer(draft_model, max_len, target_vocab)
    from speclite.spec.prompt_lookup import PromptLookupProposer

    return PromptLookupProposer(cfg.min_match, cfg.max_match)


__all__ = ["METHODS", "Proposal", "Proposer", "RequestContext", "build_proposer", "needs_draft_model", "normalize_method"]
