"""The OpenAI wire format: a request body -> what LLM.stream takes, and results -> response JSON."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from speclite.api import SamplingParams
from speclite.errors import SpecliteError
from speclite.request import parse_request

# JSON types of the fields speclite reads (bool is an int in Python: numbers exclude it below).
NUMBER = (int, float)
FIELD_TYPES = {
    "model": str, "stream": bool, "n": int, "max_tokens": int, "max_completion_tokens": int,
    "temperature": NUMBER, "top_p": NUMBER, "top_k": int, "seed": int, "stop": (str, list),
    "stream_options": dict, "sp_advice_prompt": str, "sp_edit": (int, bool),
}
# Features clients may ask for that speclite does not have, with the values that mean "not asked"
# (clients such as LangChain send the penalties at 0 and an empty logit_bias on every request).
UNSUPPORTED = {"logprobs": (False,), "top_logprobs": (0,), "tools": ([],), "functions": ([],), "echo": (False,),
               "best_of": (1,), "suffix": ("",), "response_format": ({"type": "text"},), "tool_choice": ("none",),
               "presence_penalty": (0,), "frequency_penalty": (0,), "logit_bias": ({},)}
# Chat roles of the OpenAI API; another is refused rather than handed to the chat template.
ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """A request the server refuses: an HTTP status and an OpenAI-style error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.kind, self.headers, self.code = status, param, kind, headers, code

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class ApiRequest:
    prompt: str | list[dict]  # raw text (completions) or chat messages
    params: SamplingParams
    extra: dict  # extra_config: sp_advice_prompt, sp_edit
    stream: bool
    include_usage: bool


def to_request(body: object, chat: bool, defaults: SamplingParams) -> ApiRequest:
    """Translate one OpenAI request body; ApiError (400) says what is wrong with it.

    The prompt, extra_config and sampling fields go through the same validator as a JSONL batch line
    (speclite.request); only the OpenAI envelope is checked here.
    """
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    body = {k: v for k, v in body.items() if v is not None}  # clients send null for "not set"
    for name, types in FIELD_TYPES.items():
        value = body.get(name)
        if value is not None and not _is(value, types):
            raise ApiError(f"'{name}' has the wrong type ({type(value).__name__})", param=name)
    for name, not_asked in UNSUPPORTED.items():
        if name in body and not any(_same(body[name], value) for value in not_asked):
            raise ApiError(f"'{name}' is not supported by speclite", param=name)
    if body.get("n", 1) != 1:
        raise ApiError(f"n must be 1: speclite generates one choice per request, got {body['n']}", param="n")
    if chat:
        key, prompt = "messages", _messages(body.get("messages"))
    else:
        key, prompt = "prompt", _prompt(body.get("prompt"))
    # From here on: the fields a JSONL batch line has too, checked by the one request validator.
    fields = {key: prompt, "extra_config": {k: body[k] for k in ("sp_advice_prompt", "sp_edit") if k in body} or None,
              "max_new_tokens": body.get("max_completion_tokens", body.get("max_tokens")),
              **{k: body.get(k) for k in ("temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids")}}
    try:
        request = parse_request(fields, defaults)
    except SpecliteError as e:
        param = _param(str(e), body, key)
        # The message in the client's words: max_tokens for the validator's max_new_tokens.
        message = str(e).replace("max_new_tokens", param) if param in ("max_tokens", "max_completion_tokens") else str(e)
        raise ApiError(message, param=param) from None
    options = body.get("stream_options") or {}
    return ApiRequest(request.prompt, request.params, request.extra_config, bool(body.get("stream")),
                      bool(options.get("include_usage")))


def _param(message: str, body: dict, key: str) -> str | None:
    """The request field a validator message names first, under the name the client sent (key: the
    prompt's, prompt or messages)."""
    if message.startswith("needs a non-empty"):  # the prompt or the messages are empty
        return key
    name = message.split(" ", 1)[0].split(".", 1)[0].split("[", 1)[0]
    if name == "max_new_tokens":
        return "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if name == "extra_config":
        return message.split(" ", 1)[0].split(".", 1)[-1]
    return name if name in body or name in ("messages", "prompt") else None


def _same(value: object, expected: object) -> bool:
    """value == expected, where a boolean equals only a boolean (logprobs 0 asks for log probabilities,
    false does not)."""
    if isinstance(value, bool) or isinstance(expected, bool):
        return type(value) is type(expected) and value == expected
    return value == expected


def _prompt(prompt: object) -> object:
    """A completion's prompt: a string, or a list of one (as LangChain sends it)."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) > 1:
            raise ApiError(f"one prompt per request: speclite generates one choice, got {len(prompt)} prompts",
                           param="prompt")
        return prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        raise ApiError("a prompt of token ids is not supported: send the text", param="prompt")
    if not isinstance(prompt, str):
        raise ApiError("'prompt' must be a string", param="prompt")
    return prompt


def _is(value: object, types) -> bool:
    types = types if isinstance(types, tuple) else (types,)
    return bool in types if isinstance(value, bool) else isinstance(value, types)


def _messages(messages: object) -> object:
    """Chat messages with OpenAI's text content parts joined into one string (no images)."""
    if not isinstance(messages, list):
        raise ApiError("'messages' must be a list of {role, content}", param="messages")
    if not messages:
        raise ApiError("'messages' is empty: send at least one {role, content}", param="messages")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if isinstance(role, str) and role not in ROLES:
            raise ApiError(f"messages[{i}].role '{role}' is not one of {', '.join(ROLES)}", param="messages")
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ApiError("message content parts must be text parts ({type: text, text})", param="messages")
            m = {**m, "content": "".join(p["text"] for p in content)}
        out.append(m)
    return out


# -- responses -------------------------------------------------------------------------------


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(result) -> dict:
    """OpenAI usage plus speclite's speculation figures (the aux_info of the request)."""
    completion = len(result.token_ids)
    return {"prompt_tokens": result.prompt_len, "completion_tokens": completion,
            "total_tokens": result.prompt_len + completion, "speculative": result.aux_info}


def response(chat: bool, rid: str, model: str, result) -> dict:
    """A whole (non-streamed) chat.completion or text_completion."""
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                  "finish_reason": result.finish_reason, "logprobs": None}
    else:
        choice = {"index": 0, "text": result.text, "finish_reason": result.finish_reason, "logprobs": None}
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": usage(result)}


def chunk(chat: bool, rid: str, model: str, text: str | None = None, finish_reason: str | None = None,
          role: bool = False, result=None) -> dict:
    """One streamed chunk: the role (chat, first), a text delta, the finish reason, or (result) the usage."""
    base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": model}
    if result is not None:
        return {**base, "choices": [], "usage": usage(result)}
    if chat:
        delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": None}
    return {**base, "choices": [choice]}
