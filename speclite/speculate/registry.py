"""The one list of speculation methods: name -> builder, its options, what it needs from the runtime.

The CLI flags, SpecConfig's option checks, vLLM `speculative_config` keys, bench sweeps and chat
all read this registry; a new method is a module in speclite/speculate/ that calls `register`
(and is imported by speclite/speculate/__init__.py), nothing else.

What hidden states a method wants from the target is declared by the built proposer
(`Proposer.wants`), not here: it can depend on the checkpoint (EAGLE-3 heads name their layers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from speclite.errors import SpecliteError
from speclite.kernels import cpu_gemm

NONE = "none"  # plain decoding: no proposer, no registry entry


TYPE_WORDS = {int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}


@dataclass(frozen=True)
class Option:
    """One method option: a CLI flag, a SpecConfig.options key and (maybe) a vLLM config key."""

    name: str  # key in SpecConfig.options and in BuildContext.options
    type: type  # int, float, str or bool
    default: object
    help: str
    flag: str | None = None  # CLI flag; default "--" + name with dashes
    vllm: str | None = None  # vLLM speculative_config key, if vLLM has one

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def convert(self, value):
        if value is None and self.default is None:
            return None  # an optional option left unset (a CLI flag's default arrives as None)
        try:
            if self.type is bool:
                if isinstance(value, bool):
                    return value
                if str(value).lower() in ("1", "true", "yes", "on"):
                    return True
                if str(value).lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            if isinstance(value, bool) or (self.type is int and isinstance(value, float) and not value.is_integer()):
                raise ValueError  # True is not 1, and 3.7 is not 3
            converted = self.type(value)
            if self.type is float and not math.isfinite(converted):
                raise ValueError
            return converted
        except (TypeError, ValueError, OverflowError):
            raise SpecliteError(f"{self.cli_flag} must be {TYPE_WORDS[self.type]}, got '{value}'") from None


@dataclass
class BuildContext:
    """What a method's builder gets: its options (validated, defaults filled) and the models."""

    options: dict
    target: object  # the target Transformer: its embedding / lm_head for heads that share them
    draft: object | None  # the loaded --draft model (needs_draft and draft_is_model)
    max_len: int  # context length: size of any cache the proposer keeps
    draft_dir: Path | None = None  # the resolved --draft directory (its config, or a head the builder loads itself)
    draft_quant: str | None = None  # --draft-quant, for a builder that loads its own draft

    @property
    def target_vocab(self) -> int:
        return self.target.args.vocab_size

    @property
    def body_quant(self) -> str | None:
        """BODY of --draft-quant BODY/HEAD (None without one): the scheme of the drafter's layers."""
        return (self.draft_quant or "").partition("/")[0] or None

    @property
    def head_quant(self) -> str:
        """HEAD of --draft-quant BODY/HEAD ("" without one): the scheme of the drafter's head."""
        return (self.draft_quant or "").partition("/")[2]


@dataclass(frozen=True)
class Method:
    name: str
    build: Callable[[BuildContext], object]  # -> Proposer
    help: str
    options: tuple[Option, ...] = ()
    needs_draft: bool = False  # --draft is required
    # True: --draft is a decoder speclite loads (same tokenizer checked, --draft-quant applied) and
    # hands over as ctx.draft; False: the builder loads ctx.draft_dir itself (a head, e.g. EAGLE-3);
    # a callable (options, draft_dir) -> bool decides per configuration (hybrid: a model or a head).
    draft_is_model: bool | Callable[[dict, Path | None], bool] = True
    # --draft may be given though not required (draft_is_model False): without it the builder finds
    # its own, e.g. MTP reads the module from the target's checkpoint (ctx.target.checkpoint_dir).
    draft_optional: bool = False
    needs_target: bool = False  # reads the target's weights or hidden states
    aliases: tuple[str, ...] = ()  # other tools' names (vLLM's "ngram", ...)
    check: Callable[[dict], None] | None = None  # cross-option validation; raise SpecliteError
    check_k: Callable[[dict, int], None] | None = None  # validation against a fixed --gen-num-per-cycle
    fixed_k: int | None = None  # proposes exactly this many drafts whatever --gen-num-per-cycle says
    # The built proposer's own k, read from what it loaded or its options (a DFlash drafter: its block
    # size - 1; an EAGLE tree: --eagle-num-draft-tokens - 1): the drafts per iteration when
    # --gen-num-per-cycle is not given, and auto's ceiling. None (or a None result): DEFAULT_K.
    default_k: Callable[[object], int | None] | None = None
    # The most drafts an iteration the built proposer makes (a DFlash drafter: its block size - 1; a
    # Medusa chain: its heads): a larger fixed --gen-num-per-cycle is an error, not a k that is shown but
    # never run. None (or a None result): no limit.
    max_k: Callable[[object], int | None] | None = None
    in_default_sweep: bool = True  # `speclite bench` without --sp-type runs it (when its draft is known)
    # (base method, key): vLLM names this method as its base method with this speculative_config
    # key set true (PARD: `{"method": "draft_model", "parallel_drafting": true}`).
    vllm_flag: tuple[str, str] | None = None
    # The method whose models.toml draft a configuration runs with when --draft is not given (hybrid:
    # its --hybrid-model part's, once one is named). None: this method's own.
    draft_method: Callable[[dict], str] | None = None
    # (target's HF config, out_dir, dtype, layers or None, device) -> writes a random-weight draft of
    # the published shape for that target (`layers`: fewer than published; its numbers drawn on
    # `device`): what `speclite bench --synthetic` runs the method with, for a method whose draft is
    # not a decoder (a head, a drafter).
    random_draft: Callable[[dict, Path, object, int | None, object], None] | None = None

    @property
    def takes_draft(self) -> bool:
        return self.needs_draft or self.draft_optional

    def recommends(self, options: dict) -> str:
        """The method name to ask models.toml for this configuration's draft (see draft_method)."""
        return self.draft_method(options) if self.draft_method is not None else self.name

    def loads_draft_model(self, options: dict, draft_dir: Path | None) -> bool:
        """Whether --draft is a decoder for speclite to load (see draft_is_model)."""
        return self.draft_is_model(options, draft_dir) if callable(self.draft_is_model) else self.draft_is_model


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add a method (a module's import does this); names and aliases must be new."""
    taken = {NONE, *METHODS, *(a for m in METHODS.values() for a in m.aliases)}
    for name in (method.name, *method.aliases):
        if name in taken:
            raise ValueError(f"speculation method name '{name}' is already registered")
    for opt in method.options:
        other = option_by_name(opt.name)
        if other is not None and other != opt:
            raise ValueError(f"option '{opt.name}' of '{method.name}' differs from the one already registered")
    METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method (tests register throwaway ones)."""
    METHODS.pop(name, None)


def method_names() -> tuple[str, ...]:
    """Every --sp-type value, "none" first."""
    return (NONE, *METHODS)


def normalize_method(name: str | None) -> str:
    """The registered name for a method name or alias (case-insensitive)."""
    key = (name or NONE).lower()
    for method in METHODS.values():
        if key in method.aliases:
            return method.name
    if key != NONE and key not in METHODS:
        raise SpecliteError(f"unknown speculation method '{name}': choose from {', '.join(method_names())}")
    return key


def get_method(name: str) -> Method:
    return METHODS[normalize_method(name)]


def vllm_flags() -> set[str]:
    """speculative_config keys that select a method spelled as another one plus a flag."""
    return {m.vllm_flag[1] for m in METHODS.values() if m.vllm_flag}


def vllm_method(config: dict) -> str:
    """The method a vLLM speculative_config names (a model alone means a draft model)."""
    name = config.get("method") or ("vanilla" if config.get("model") else NONE)
    for method in METHODS.values():
        if method.vllm_flag and not isinstance(config.get(method.vllm_flag[1], False), bool):
            raise SpecliteError(f"speculative_config '{method.vllm_flag[1]}' must be true or false, "
                                f"got {config[method.vllm_flag[1]]!r}")
        if method.vllm_flag and config.get(method.vllm_flag[1]):
            base, flag = method.vllm_flag
            if normalize_method(name) != base:
                raise SpecliteError(f"speculative_config '{flag}' applies to method '{base}', not '{name}'")
            return method.name
    return name


def all_options() -> list[Option]:
    """Every registered option once (methods may share one, e.g. n-gram bounds)."""
    seen: dict[str, Option] = {}
    for method in METHODS.values():
        for opt in method.options:
            seen.setdefault(opt.name, opt)
    return list(seen.values())


def option_by_name(name: str) -> Option | None:
    return next((o for o in all_options() if o.name == name), None)


def method_options(method: str, given: dict, k: int | str | None = None) -> dict:
    """The method's options from `given` (names it does not know are an error), defaults filled;
    checked against a fixed k (--gen-num-per-cycle) when one is given."""
    m = get_method(method)
    known = {o.name: o for o in m.options}
    unknown = set(given) - set(known)
    if unknown:
        raise SpecliteError(f"--sp-type {m.name} takes no option {', '.join(sorted(unknown))}")
    options = {name: opt.convert(given[name]) if name in given else opt.default for name, opt in known.items()}
    if m.check is not None:
        m.check(options)
    if m.check_k is not None and isinstance(k, int):
        m.check_k(options, k)
    return options


def build_proposer(method: str, ctx: BuildContext):
    """The proposer of a registered method (options already validated by method_options); its own
    models draft with loose products (cpu_gemm.drafting)."""
    proposer = get_method(method).build(ctx)
    cpu_gemm.drafting(proposer.resident()[0], ctx.target)
    return proposer
