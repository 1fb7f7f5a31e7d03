"""The one error type the CLI turns into a single clear line and a non-zero exit."""


class SpecliteError(Exception):
    """A user-facing failure: bad input, a missing model, an unsupported checkpoint."""


class ContextLengthError(SpecliteError):
    """A prompt longer than the model's context (the server answers it with OpenAI's
    `context_length_exceeded` code)."""
