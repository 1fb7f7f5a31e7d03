"""The configurations a bench run compares: plain decoding per target quant, then each method x k."""

from __future__ import annotations

from dataclasses import dataclass

from speclite.api import SpecConfig
from speclite.errors import SpecliteError
from speclite.speculate import get_method, method_names, normalize_method
from speclite.speculate.token_map import TOKEN_MAP
from speclite.speculate.verify import POLICIES


@dataclass(frozen=True)
class BenchConfig:
    method: str  # "plain" (no speculation at all) or a speculation method
    k: int | str | None  # drafts per iteration, "auto", 0 for plain / naive, None: the method's own (Runner)
    quant: str | None  # target quantization at load time
    accept_policy: str = "normal"
    draft: str | None = None  # what this row's method drafts with (each method may have its own)
    token_map: str | None = None  # this row's --token-map (a method that takes one), or none

    @property
    def label(self) -> str:
        parts = [self.method if self.method in ("plain", "naive") else f"{self.method} k={self.k}"]
        if self.token_map:
            parts.append(f"map={self.token_map}")  # as given: two maps of one file name stay two rows
        if self.quant:
            parts.append(f"[{self.quant}]")
        if self.accept_policy != "normal" and self.method != "plain":
            parts.append(f"({self.accept_policy})")
        return " ".join(parts)

    @property
    def proposer_key(self) -> tuple[str, str | None]:
        """Rows of one method and map share a proposer (k is asked per iteration)."""
        return self.method, self.token_map

    def spec_config(self, method_options: dict) -> SpecConfig:
        """The validated SpecConfig of this row; `method_options` may hold other methods' options too."""
        own = {o.name for o in get_method(self.method).options}
        options = {name: value for name, value in method_options.items() if name in own}
        if TOKEN_MAP.name in own:
            options[TOKEN_MAP.name] = self.token_map
        return SpecConfig(method=self.method, k=self.k, draft=self.draft, accept_policy=self.accept_policy,
                          options=options).validated()


def split_list(text: str, flag: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise SpecliteError(f"{flag} needs at least one value")
    return items


def parse_ks(text: str | None) -> list[int | str | None]:
    """--k's values; no --k is one None: each method's own default k, known once its proposer is built."""
    if text is None:
        return [None]
    ks: list[int | str | None] = []
    for item in split_list(text, "--k"):
        if item == "auto":
            ks.append(item)
        elif item.isdigit() and 1 <= int(item) <= 64:
            ks.append(int(item))
        else:
            raise SpecliteError(f"--k values are numbers from 1 to 64 or 'auto', got '{item}'")
    return list(dict.fromkeys(ks))


def parse_methods(text: str) -> list[str]:
    methods = []
    for item in split_list(text, "--sp-type"):
        try:
            method = normalize_method(item)
        except SpecliteError:
            raise SpecliteError(f"unknown --sp-type '{item}': choose from {', '.join(method_names()[1:])}") from None
        if method != "none":  # plain decoding is always the baseline
            methods.append(method)
    return list(dict.fromkeys(methods))


def parse_maps(text: str | None) -> list[str | None]:
    """--token-map's values in bench: maps, or `none` for a row without one (side by side in one run)."""
    if not text:
        return [None]
    return list(dict.fromkeys(None if m.lower() == "none" else m for m in split_list(text, "--token-map")))


def parse_quants(text: str | None) -> list[str | None]:
    if not text:
        return [None]
    return list(dict.fromkeys(None if q.lower() in ("none", "fp", "") else q for q in split_list(text, "--quant")))


def build_sweep(methods: list[str], ks: list[int | str], quants: list[str | None],
                accept_policy: str = "normal", drafts: dict[str, str | None] | None = None,
                maps: list[str | None] = (None,)) -> list[BenchConfig]:
    """`drafts`: method -> the draft it runs with (none for a method left out); `maps`: the token maps
    each method that takes one runs with (None: without)."""
    drafts = drafts or {}
    if accept_policy not in POLICIES:
        raise SpecliteError(f"unknown accept policy '{accept_policy}'")
    configs = []
    for quant in quants:
        configs.append(BenchConfig("plain", 0, quant))
        for method in methods:
            m = get_method(method)
            # naive: zero drafts whatever k is, one row measures the spec path's cost
            for token_map in maps if TOKEN_MAP in m.options else (None,):
                configs.extend(BenchConfig(method, k, quant, accept_policy, drafts.get(method), token_map)
                               for k in ([m.fixed_k] if m.fixed_k is not None else ks))
    return configs
