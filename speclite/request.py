"""One validation of a generation request: a JSONL line, an API call or a server request.

Every field is checked for type and range here, before anything reaches the tokenizer or torch,
and every message names the field ("seed must be an integer in [0, 2**63)"). Callers prefix
where the request came from ("line 7: ...").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from speclite.sampling import SamplingParams
from speclite.errors import SpecliteError

SEED_LIMIT = 2**63
# Per-request fields that override the defaults (the command's sampling flags).
SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids")
EXTRA_CONFIG_KEYS = ("sp_advice_prompt", "sp_advice_ids", "sp_edit")


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str | list[dict]  # raw text, or chat messages [{role, content}]
    params: SamplingParams
    extra_config: dict = field(default_factory=dict)  # sp_advice_prompt | sp_advice_ids, sp_edit
    id: str | int | None = None


def parse_request(data: object, defaults: SamplingParams | None = None, where: str | None = None) -> GenerationRequest:
    """A validated request from a decoded JSON object; SpecliteError naming the field otherwise.

    `defaults` supplies the sampling fields the request leaves out; `where` ("line 7") prefixes
    every message.
    """
    try:
        if not isinstance(data, dict):
            raise SpecliteError("a request must be a JSON object")
        data = {k: v for k, v in data.items() if v is not None}  # null: not given, as for the sampling fields
        if "id" in data:
            check_id(data["id"])
        if "prompt" in data and "messages" in data:
            raise SpecliteError("give either 'prompt' or 'messages', not both")
        prompt = check_prompt(data.get("messages", data.get("prompt")))
        base = {f.name: getattr(defaults or SamplingParams(), f.name) for f in fields(SamplingParams)}
        overrides = {k: data[k] for k in SAMPLING_FIELDS if k in data}
        params = SamplingParams(**{**base, **overrides})
        extra = check_extra_config(data.get("extra_config"))
    except SpecliteError as e:
        raise SpecliteError(f"{where}: {e}" if where else str(e)) from None
    return GenerationRequest(prompt, params, extra, data.get("id"))


def check_id(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SpecliteError("id must be a string or an integer")
    if isinstance(value, str):
        _check_text(value, "id")


def check_prompt(prompt: object) -> str | list[dict]:
    """A non-empty string, or a non-empty list of {role, content} string messages."""
    if isinstance(prompt, str):
        if not prompt:
            raise SpecliteError("prompt must be a non-empty string")
        _check_text(prompt, "prompt")
        return prompt
    if isinstance(prompt, list) and prompt:
        for i, message in enumerate(prompt):
            if not isinstance(message, dict):
                raise SpecliteError(f"messages[{i}] must be an object with 'role' and 'content'")
            for key in ("role", "content"):
                if not isinstance(message.get(key), str):
                    raise SpecliteError(f"messages[{i}].{key} must be a string")
                _check_text(message[key], f"messages[{i}].{key}")
        return prompt
    raise SpecliteError("needs a non-empty 'prompt' string or 'messages' list of {role, content}")


TOP_P_FLOOR = 1.1754943508222875e-38  # float32's smallest normal number


def check_sampling(params: SamplingParams) -> None:
    """Types and ranges of every sampling field (SamplingParams calls this on construction, the engine
    on each request: a field may have changed since); a lone stop string becomes a list of one, a top_p
    too small for float32 its smallest normal number."""
    _check_int(params.max_new_tokens, "max_new_tokens", low=1)
    _check_number(params.temperature, "temperature")
    if params.temperature < 0:
        raise SpecliteError(f"temperature must be >= 0, got {params.temperature}")
    _check_number(params.top_p, "top_p")
    if not 0 < params.top_p <= 1:
        raise SpecliteError(f"top_p must be in (0, 1], got {params.top_p}")
    # The warps compare in float32, where a top_p under its smallest normal is 0 and masks every token;
    # any top_p that small keeps the top token alone, as this one does.
    params.top_p = max(params.top_p, TOP_P_FLOOR)
    _check_int(params.top_k, "top_k", low=0)
    if params.seed is not None and (_not_int(params.seed) or not 0 <= params.seed < SEED_LIMIT):
        raise SpecliteError(f"seed must be an integer in [0, 2**63), got {params.seed!r}")
    stops = [params.stop] if isinstance(params.stop, str) else params.stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise SpecliteError(f"stop must be a non-empty string or a list of them, got {params.stop!r}")
    for s in stops:
        _check_text(s, "stop")
    params.stop = list(stops)
    if not isinstance(params.ignore_eos, bool):
        raise SpecliteError("ignore_eos must be true or false")
    ids = params.stop_token_ids
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                     for i in ids):
        raise SpecliteError(f"stop_token_ids must be a list of token ids (integers >= 0), got {ids!r}")
    params.stop_token_ids = list(ids)


def check_extra_config(extra: object, vocab_size: int | None = None) -> dict:
    """extra_config as a fresh dict; advice token ids are checked against vocab_size when given."""
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise SpecliteError("extra_config must be an object")
    unknown = sorted(set(extra) - set(EXTRA_CONFIG_KEYS))
    if unknown:
        raise SpecliteError(f"unknown extra_config key '{unknown[0]}': known are {', '.join(EXTRA_CONFIG_KEYS)}")
    advice = extra.get("sp_advice_prompt")
    if advice is not None:
        if not isinstance(advice, str):
            raise SpecliteError("extra_config.sp_advice_prompt must be a string")
        _check_text(advice, "extra_config.sp_advice_prompt")
    ids = extra.get("sp_advice_ids")
    if ids is not None:
        if advice is not None:
            raise SpecliteError("extra_config: give sp_advice_prompt or sp_advice_ids, not both")
        if not isinstance(ids, list) or any(_not_int(t) or t < 0 for t in ids):
            raise SpecliteError("extra_config.sp_advice_ids must be a list of non-negative integer token ids")
        if vocab_size is not None and any(t >= vocab_size for t in ids):
            raise SpecliteError(f"extra_config.sp_advice_ids holds {max(ids)}, outside the vocabulary of {vocab_size} tokens")
    edit = extra.get("sp_edit", 0)
    if edit not in (0, 1) or isinstance(edit, float):
        raise SpecliteError(f"extra_config.sp_edit must be 0 or 1, got {edit!r}")
    return dict(extra)


def _not_int(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


def _check_int(value: object, name: str, low: int) -> None:
    if _not_int(value) or value < low:
        raise SpecliteError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_number(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecliteError(f"{name} must be a finite number, got {value!r}")


def _check_text(text: str, name: str) -> None:
    # A lone surrogate (from "\ud800" in JSON) cannot be tokenized or written back as UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SpecliteError(f"{name} holds a lone surrogate ({text[e.start]!a}), which is not valid Unicode") from None
