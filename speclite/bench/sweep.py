"""The configurations a bench run compares: plain decoding per target quant, then each method x k."""

from __future__ import annotations

from dataclasses import dataclass

from speclite.api import ACCEPT_POLICIES, SpecConfig
from speclite.errors import SpecliteError
from speclite.spec import METHODS, normalize_method


@dataclass(frozen=True)
class BenchConfig:
    method: str  # "plain" (no speculation at all) or a speculation method
    k: int | str  # drafts per iteration, "auto", or 0 for plain / naive
    quant: str | None  # target quantization at load time
    accept_policy: str = "normal"

    @property
    def label(self) -> str:
        parts = [self.method if self.method in ("plain", "naive") else f"{self.method} k={self.k}"]
        if self.quant:
            parts.append(f"[{self.quant}]")
        if self.accept_policy != "normal" and self.method != "plain":
            parts.append(f"({self.accept_policy})")
        return " ".join(parts)

    def spec_config(self, draft: str | None, min_match: int, max_match: int) -> SpecConfig:
        return SpecConfig(self.method, self.k, draft, None, min_match, max_match, None, self.accept_policy).validated()


def split_list(text: str, flag: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise SpecliteError(f"{flag} needs at least one value")
    return items


def parse_ks(text: str) -> list[int | str]:
    ks: list[int | str] = []
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
            raise SpecliteError(f"unknown --sp-type '{item}': choose from {', '.join(METHODS[1:])}") from None
        if method != "none":  # plain decoding is always the baseline
            methods.append(method)
    return list(dict.fromkeys(methods))


def parse_quants(text: str | None) -> list[str | None]:
    if not text:
        return [None]
    return list(dict.fromkeys(None if q.lower() in ("none", "fp", "") else q for q in split_list(text, "--quant")))


def build_sweep(methods: list[str], ks: list[int | str], quants: list[str | None],
                accept_policy: str = "normal") -> list[BenchConfig]:
    if accept_policy not in ACCEPT_POLICIES:
        raise SpecliteError(f"unknown accept policy '{accept_policy}'")
    configs = []
    for quant in quants:
        configs.append(BenchConfig("plain", 0, quant))
        for method in methods:
            if method == "naive":  # zero drafts whatever k is: one row measures the spec path's cost
                configs.append(BenchConfig("naive", 0, quant, accept_policy))
            else:
                configs.extend(BenchConfig(method, k, quant, accept_policy) for k in ks)
    return configs
