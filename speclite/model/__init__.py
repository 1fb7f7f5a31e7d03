from speclite.model.decoder import ModelArgs, Transformer
from speclite.model.kv_cache import KVCache
from speclite.model.loader import load_model

__all__ = ["KVCache", "ModelArgs", "Transformer", "load_model"]
