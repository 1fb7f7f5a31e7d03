"""The one error type the CLI turns into a single clear line and a non-zero exit."""


class SpecliteError(Exception):
    """A user-facing failure: bad input, a missing model, an unsupported checkpoint."""
