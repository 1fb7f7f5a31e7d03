"""speclite: a quantization-first LLM runtime with lossless speculative decoding."""

from speclite.api import LLM, SpecConfig
from speclite.engine.engine import RequestOutput
from speclite.sampling import SamplingParams
from speclite.errors import SpecliteError

__all__ = ["LLM", "RequestOutput", "SamplingParams", "SpecConfig", "SpecliteError"]
__version__ = "0.1.0"
