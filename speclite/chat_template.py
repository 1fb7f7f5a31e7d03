"""Chat messages -> prompt text through the model's own chat template, failing in one line."""

from __future__ import annotations

from speclite.errors import SpecliteError


def render_chat(tokenizer, messages: list[dict], model_name: str) -> str:
    if not tokenizer.chat_template:
        raise SpecliteError(f"model '{model_name}' has no chat template: pass a plain prompt")
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # noqa: BLE001 - the template is the model's own code: any failure is its verdict
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecliteError(f"the chat template of '{model_name}' rejected the messages: {message}") from None
