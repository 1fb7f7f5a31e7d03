"""The Python face of speclite: LLM, SamplingParams, SpecConfig."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from speclite import hub
from speclite.chat_template import render_chat
from speclite.engine.engine import Chunk, Engine, RequestOutput
from speclite.engine.loop import Speculation
from speclite.engine.memory import model_bytes
from speclite.sampling import SamplingParams
from speclite.errors import CLI_RUNNING, ContextLengthError, SpecliteError
from speclite.model import Transformer, load_model
from speclite.model.loader import read_config, resolve_device, resolve_dtype
from speclite.model.prepare import prepare
from speclite.model.static import StaticDecoder
from speclite.model.tokenizer import load_tokenizer
from speclite.model.validate import context_length
from speclite.quant import checkpoint
from speclite.request import check_extra_config, check_prompt
from speclite.speculate import BuildContext, build_proposer, get_method
from speclite.speculate.registry import NONE, all_options, method_options, normalize_method, vllm_flags, vllm_method
from speclite.speculate.schedule import DEFAULT_K, spec_length
from speclite.speculate.verify import check_names

# vLLM speculative_config keys every method shares; each method's own keys come from the registry.
VLLM_KEYS = {"method": "method", "num_speculative_tokens": "k", "model": "draft", "quantization": "draft_quant",
             "verify": "verify", "accept_policy": "accept_policy"}

# The CLI flags errors name that are not a method's own option, by their keys in the Python API.
API_KEYS = {"--gen-num-per-cycle": "num_speculative_tokens", "--sp-type": "method", "--draft": "model",
            "--draft-quant": "quantization", "--verify": "verify", "--accept-policy": "accept_policy",
            "--max-model-len": "max_model_len", "--device": "device", "--dtype": "dtype", "--quant": "quant",
            "--models-file": "models_file"}


def in_api_words(call):
    """`call`, its SpecliteErrors naming the Python API's keys where they name CLI flags (a method's
    options by their vLLM key, else their SpecConfig.options name), unless a CLI command runs it; a
    stream it returns, those raised while it is read too."""
    @functools.wraps(call)
    def worded(*args, **kwargs):
        try:
            out = call(*args, **kwargs)
        except SpecliteError as e:
            _reword(e)
            raise
        return _read_in_api_words(out) if isinstance(out, Generator) else out
    return worded


def _read_in_api_words(stream: Generator) -> Generator:
    try:
        yield from stream
    except SpecliteError as e:
        _reword(e)
        raise


def _reword(e: SpecliteError) -> None:
    if not CLI_RUNNING.get():
        keys = {**{o.cli_flag: o.vllm or o.name for o in all_options()}, **API_KEYS}
        e.args = (re.sub(r"--[a-z][a-z0-9-]*", lambda m: keys.get(m[0], m[0]), str(e)),)


@dataclass
class SpecConfig:
    method: str = "none"  # a registered method name or alias (speclite.speculate.registry)
    # Drafts per iteration, or "auto"; None: the method's own default (spec_length), DEFAULT_K for most.
    k: int | str | None = None
    draft: str | None = None  # model (or head) for methods that need one (alias, repo id or directory)
    draft_quant: str | None = None
    verify: str | None = None  # None: greedy at temperature 0, rejection otherwise
    accept_policy: str = "normal"
    options: dict = field(default_factory=dict)  # the method's own options by name (registry)

    @classmethod
    def from_vllm(cls, config: dict) -> "SpecConfig":
        """A vLLM-style speculative_config dict."""
        method_keys = {o.vllm: o.name for o in all_options() if o.vllm}
        unknown = set(config) - set(VLLM_KEYS) - set(method_keys) - vllm_flags()
        if unknown:
            raise SpecliteError(f"unknown speculative_config keys: {', '.join(sorted(unknown))}")
        fields = {VLLM_KEYS[key]: value for key, value in config.items() if key in VLLM_KEYS}
        fields["method"] = vllm_method(config)
        options = {method_keys[key]: value for key, value in config.items() if key in method_keys}
        return cls(**fields, options=options)

    def validated(self) -> "SpecConfig":
        for value, name, types, what in ((self.method, "method", str, "a string"),
                                         (self.options, "options", dict, "a dict"),
                                         (self.draft, "draft (model)", (str, os.PathLike), "a path or name"),
                                         (self.draft_quant, "draft_quant", str, "a string")):
            if value is not None and not isinstance(value, types):
                raise SpecliteError(f"speculative {name} must be {what}, got {value!r}")
        if self.options is None:  # no options of its own
            return replace(self, options={}).validated()
        if self.draft is not None and not str(self.draft).strip():
            raise SpecliteError("speculative draft (model) is empty: name a draft, or leave it out for models.toml's")
        if self.k is not None and (isinstance(self.k, bool) or not isinstance(self.k, (int, str))):
            raise SpecliteError(f"--gen-num-per-cycle must be an integer or 'auto', "
                                f"got {self.k!r}")
        method = normalize_method(self.method)
        if method == NONE:  # each would be ignored
            for value, flag in ((self.k, "--gen-num-per-cycle"), (self.verify, "--verify"),
                                (None if self.accept_policy == "normal" else self.accept_policy, "--accept-policy")):
                if value is not None:
                    raise SpecliteError(f"{flag} is not used by --sp-type none: nothing is drafted")
        k = self.k
        own = None if method == NONE else get_method(method)
        if k is None and (own is None or (own.default_k is None and own.max_k is None)):
            k = DEFAULT_K  # known now; a method with a default k or a cap of its own reads it from its built proposer
        if isinstance(k, str):
            if k != "auto" and not (k.isascii() and k.isdigit()):  # not '²', which isdigit() takes
                raise SpecliteError(f"--gen-num-per-cycle must be a number or 'auto', "
                                    f"got '{k}'")
            k = k if k == "auto" else int(k)
        if isinstance(k, int) and not 0 <= k <= 64:
            raise SpecliteError(f"--gen-num-per-cycle must be between 0 and 64, got {k}")
        if k == 0 and method != NONE and get_method(method).fixed_k is None:  # a draft loaded, never asked for anything
            raise SpecliteError(f"--gen-num-per-cycle 0 has --sp-type {method} draft nothing: use --sp-type naive "
                                "(the loop without drafts) or none")
        check_names(self.verify, self.accept_policy)
        takes_draft = method != NONE and get_method(method).takes_draft
        for value, flag in ((self.draft, "--draft"), (self.draft_quant, "--draft-quant")):
            if value is not None and not takes_draft:
                raise SpecliteError(f"{flag} is not used by --sp-type {method}: it has no draft")
        options = method_options(method, self.options, k) if method != NONE else {}
        return replace(self, method=method, k=k, options=options)


def _params(params) -> SamplingParams:
    """One SamplingParams for every prompt (None: the defaults)."""
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise SpecliteError(f"params must be a SamplingParams, got {type(params).__name__}")
    return params


def eos_ids(model_dir: Path, tokenizer) -> set[int]:
    ids: set[int] = set()
    gen_config = model_dir / "generation_config.json"
    if gen_config.exists():
        eos = json.loads(gen_config.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Drafts are token ids: both models must mean the same thing by each id."""
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise SpecliteError(
            f"draft '{draft_name}' and target '{target_name}' use different tokenizers "
            f"({len(draft_tok)} vs {len(target_tok)} tokens): pick a draft of the same model family"
        )


def _load(model_dir: Path, device, dtype, quant: str | None, max_model_len: int | None = None,
          flag: str = "--quant") -> Transformer:
    """A model loaded, quantized at load time to `quant` (the `flag` that asked for it) if given."""
    already = quant_label(None, model_dir) if quant else None
    if already:
        raise SpecliteError(f"{flag} {quant}: {model_dir} is quantized already ({already}); "
                            f"leave {flag} out to run it as it is")
    model = load_model(model_dir, device=device, dtype=dtype, max_model_len=max_model_len)
    if quant:
        from speclite.quant import quantize_model

        model = quantize_model(model, quant)
    return model


def quant_label(load_time: str | None, model_dir: Path | None) -> str | None:
    """How a model's weights are quantized, for summary lines: the load-time scheme asked for, else
    its checkpoint's quantization_config; None where dense."""
    if load_time or model_dir is None:
        return load_time
    qconfig = read_config(model_dir).get("quantization_config") if (model_dir / "config.json").is_file() else None
    return checkpoint.label(qconfig) if isinstance(qconfig, dict) else None


def load_draft(draft: str, target_tokenizer, target_name: str, device, dtype, quant: str | None = None,
               models_file=None) -> Transformer:
    """A draft model, checked to share the target's tokenizer, quantized at load if asked."""
    draft_dir = hub.resolve(draft, models_file)
    check_same_tokenizer(target_tokenizer, load_tokenizer(draft_dir), target_name, str(draft))
    return _load(draft_dir, device, dtype, quant, flag="--draft-quant")


class LLM:
    """A target model, optionally with a speculative proposer, ready to generate.

    >>> llm = LLM("tiny-code", speculative_config={"method": "vanilla", "num_speculative_tokens": 4})
    >>> llm.generate("def add(a, b):", SamplingParams(max_new_tokens=32))[0].text
    """

    @in_api_words
    def __init__(
        self,
        model: str | os.PathLike,
        speculative_config: dict | SpecConfig | None = None,
        *,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        quant: str | None = None,
        models_file: str | os.PathLike | None = None,
        max_model_len: int | None = None,
        static: bool = False,
    ):
        """`static`: fixed-shape decode and verify steps, captured as CUDA graphs on a GPU."""
        if not isinstance(static, bool):
            raise SpecliteError(f"static takes True or False, got {static!r}")
        if isinstance(speculative_config, dict):
            speculative_config = SpecConfig.from_vllm(speculative_config)
        elif not isinstance(speculative_config, (SpecConfig, type(None))):
            raise SpecliteError(f"speculative_config must be a dict (vLLM's keys) or a SpecConfig, "
                                f"got {type(speculative_config).__name__}")
        self.spec_config = (speculative_config or SpecConfig()).validated()
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.model_name, self.quant = str(model), quant
        self.model_dir = hub.resolve(model, models_file)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.target = _load(self.model_dir, self.device, self.dtype, quant, max_model_len)
        self.max_len = context_length(self.target.args.max_position_embeddings, max_model_len)
        self.quant_label = quant_label(quant, self.model_dir)  # the checkpoint's where none was asked for
        self.draft_name = self.draft_quant_label = None
        self.engine = Engine(self.target, self.tokenizer, eos_ids(self.model_dir, self.tokenizer), self.max_len)
        self._speculation = self._build_speculation(models_file)
        self.engine.spec = self._speculation
        prepare(self.target, *(self._speculation.proposer.resident()[0] if self._speculation else ()))
        if static:
            self.engine.target = StaticDecoder(self.target, self.engine.cache)
            if self._speculation is not None:
                self._speculation.proposer.use_static()

    def _build_speculation(self, models_file) -> Speculation | None:
        cfg = self.spec_config
        if cfg.method == NONE:
            return None
        method, draft_model, draft_dir = get_method(cfg.method), None, None
        # Without --draft, models.toml's recommendation for this method (an optional draft's too: an
        # MTP module named there is used rather than the target's own).
        draft = (cfg.draft or hub.recommended_draft(self.model_name, models_file, method.recommends(cfg.options))
                 if method.takes_draft else None)
        if draft is None and method.needs_draft:
            raise SpecliteError(f"--sp-type {cfg.method} needs --draft"
                                + (f": models.toml recommends no draft for '{self.model_name}'"
                                   if method.draft_is_model else ""))
        if draft is not None:
            draft_dir = hub.resolve(draft, models_file)
            if method.loads_draft_model(cfg.options, draft_dir):
                draft_model = load_draft(draft, self.tokenizer, self.model_name, self.device, self.dtype,
                                         cfg.draft_quant, models_file)
            self.draft_name, self.draft_quant_label = str(draft), quant_label(cfg.draft_quant, draft_dir)
        ctx = BuildContext(cfg.options, self.target, draft_model, self.max_len, draft_dir, cfg.draft_quant)
        proposer = build_proposer(cfg.method, ctx)
        length = spec_length(cfg.k, method, proposer)
        if cfg.k is None:  # the method's own default, now that its proposer has read it
            self.spec_config = replace(cfg, k=length.k)
        # The verifier depends on the request's temperature: the engine picks it per request.
        return Speculation(proposer, length, cfg.verify, cfg.accept_policy)

    # -- prompts -----------------------------------------------------------------------------

    def encode(self, prompt: str | list[dict]) -> list[int]:
        """Token ids of a raw prompt, or of chat messages rendered with the model's chat template. A text
        too long for the context whatever its tokens is refused before it is tokenized (megabytes of it
        would hold the engine for seconds)."""
        raw = isinstance(check_prompt(prompt), str)
        text = prompt if raw else render_chat(self.tokenizer, prompt, self.model_name)
        if len(text) > self.max_len * self._longest_token:
            raise ContextLengthError(f"prompt of {len(text)} characters (at least {len(text) // self._longest_token} "
                                     f"tokens) does not fit the maximum context length of {self.max_len} tokens")
        return self.tokenizer.encode(text) if raw else self.tokenizer.encode(text, add_special_tokens=False)

    @functools.cached_property
    def _longest_token(self) -> int:
        """The most characters one token can stand for (its vocabulary string, at least as long)."""
        return max(map(len, self.tokenizer.get_vocab()), default=1)

    def extra_config(self, extra_config: dict | None) -> dict:
        """extra_config with sp_advice_prompt tokenized (advice may also come as sp_advice_ids)."""
        extra = check_extra_config(extra_config, self.target.args.vocab_size)
        advice = extra.pop("sp_advice_prompt", None)
        if advice:
            extra["sp_advice_ids"] = self.tokenizer.encode(advice, add_special_tokens=False)
        return extra

    # -- generation ----------------------------------------------------------------------------

    @in_api_words
    def stream(
        self,
        prompt: str | list[dict],
        params: SamplingParams | None = None,
        extra_config: dict | None = None,
        result: list | None = None,
    ) -> Iterator[Chunk]:
        """Chunks of one prompt's answer as they are verified; the RequestOutput lands in `result`."""
        params = _params(params)
        if result is not None and not isinstance(result, list):
            raise SpecliteError(f"result must be a list (the output is appended to it), got {type(result).__name__}")
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            raise SpecliteError("stream takes one prompt (a string or chat messages [{role, content}]), "
                                "got a list of strings: generate takes several")
        return self.engine.stream(self.encode(prompt), params, self.extra_config(extra_config), result)

    @in_api_words
    def generate(
        self,
        prompts: str | list[dict] | list[str | list[dict]],
        params: SamplingParams | None = None,
        extra_config: dict | None = None,
    ) -> list[RequestOutput]:
        """Outputs for one prompt or a list of them (a prompt is a string or chat messages)."""
        params = _params(params)
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], dict)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise SpecliteError("prompts must be a string, chat messages ([{role, content}]) or a list of them, "
                                f"got {type(prompts).__name__}")
        for i, p in enumerate(prompts):
            if not isinstance(p, (str, list)):
                raise SpecliteError(f"prompts[{i}] must be a string or chat messages ([{{role, content}}]), "
                                    f"got {type(p).__name__}")
        # Every prompt checked and tokenized before the first is answered: a bad one loses no answers.
        requests = [self.encode(p) for p in prompts]
        extra = self.extra_config(extra_config)
        return [self.engine.generate(ids, params, extra) for ids in requests]  # (read, never changed)

    # -- runtime controls (chat's /k and /sp) --------------------------------------------------

    @in_api_words
    def set_k(self, k: int | str) -> None:
        """Drafts per iteration from now on: a number, or "auto" to adapt."""
        if self.engine.spec is None:
            raise SpecliteError("speculation is off: start with --sp-type to set k")
        k = replace(self.spec_config, k=k).validated().k
        self.engine.spec.length = spec_length(k, get_method(self.spec_config.method), self._speculation.proposer)
        self.spec_config = replace(self.spec_config, k=k)

    @property
    def k_label(self) -> str | None:
        """Drafts per iteration now ("4", "auto(3)"); None while speculation is off."""
        return self.engine.spec.length.label if self.engine.spec is not None else None

    def memory(self) -> dict[str, int]:
        """Resident bytes: target weights and KV cache, and the proposer's own models and caches."""
        models, caches = self._speculation.proposer.resident() if self._speculation else ([], [])
        return {"weights": model_bytes(self.target), "kv": self.engine.cache.nbytes(),
                "draft_weights": sum(model_bytes(m) for m in models), "draft_kv": sum(c.nbytes() for c in caches)}

    @property
    def speculation_available(self) -> bool:
        return self._speculation is not None

    @in_api_words
    def set_speculation(self, on: bool) -> None:
        """Switch speculation off (plain decoding) or back on, keeping the loaded draft."""
        if not isinstance(on, bool):
            raise SpecliteError(f"set_speculation takes True or False, got {on!r}")
        if on and self._speculation is None:
            raise SpecliteError("no speculation method was loaded: start with --sp-type")
        self.engine.spec = self._speculation if on else None

    def describe(self) -> str:
        """One line saying what was loaded."""
        spec = self.spec_config

        def named(what: str, name: str, quant: str | None) -> str:
            return f"{what} {name}" + (f" [{quant}]" if quant else "")

        parts = [named("target", self.model_name, self.quant_label)]
        if self.draft_name:
            parts.append(named("draft", self.draft_name, self.draft_quant_label))
        if self.engine.spec is not None:
            parts.append(f"speculation {spec.method} k={self.k_label}")
        parts.append(f"{self.device.type} {str(self.dtype).removeprefix('torch.')}")
        return ", ".join(parts)
