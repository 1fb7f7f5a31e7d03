"""The one error type the CLI turns into a single clear line and a non-zero exit."""

from contextvars import ContextVar

# Messages name options by their CLI flags (--gen-num-per-cycle); the Python API rewords them with
# its own keys (speclite.api) unless a CLI command is running, which sets this while it runs.
CLI_RUNNING: ContextVar[bool] = ContextVar("cli_running", default=False)


class SpecliteError(Exception):
    """A user-facing failure: bad input, a missing model, an unsupported checkpoint."""


class ContextLengthError(SpecliteError):
    """A prompt longer than the model's context (the server answers it with OpenAI's
    `context_length_exceeded` code)."""


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C that ends a command, saying what stands and what to run again (the CLI's one line)."""
