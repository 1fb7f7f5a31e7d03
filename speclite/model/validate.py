"""One validation of a model directory, before any weight is read.

Config fields (types, sizes, RoPE scaling), generation config, safetensors index and headers
(shapes against the config), tokenizer.json (structure, and its vocabulary against the embedding
table), the context asked for, and whether weights + KV cache fit in memory. Each failure is one
SpecliteError naming the file and the field.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import torch

from speclite.errors import SpecliteError
from speclite.kernels import cpu_gemm

DEFAULT_CONTEXT = 4096
REQUIRED_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window")
# RoPE types whose parameters the decoder reads, and the fields each one needs.
ROPE_FIELDS = {"linear": ("factor",), "yarn": ("factor",),
               "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
# Bytes per element of the safetensors dtypes (the header names them).
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
               "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def check_model_dir(model_dir: Path, device: torch.device, dtype: torch.dtype, max_model_len: int | None = None) -> dict:
    """The validated config.json of model_dir; SpecliteError on the first problem found."""
    config, headers = check_checkpoint(model_dir)
    context = context_length(config.get("max_position_embeddings", DEFAULT_CONTEXT), max_model_len)
    check_memory(headers, config, context, device, dtype, model_dir)
    return config


def check_checkpoint(model_dir: Path) -> tuple[dict, dict[str, dict]]:
    """The validated config and safetensors headers (shapes checked against the config), no weights read."""
    config = check_model_files(model_dir)
    headers = safetensors_headers(model_dir)
    _check_shapes(headers, config, model_dir)
    return config, headers


def check_model_files(model_dir: Path) -> dict:
    """The JSON files (config, generation config, tokenizer.json) that a tokenizer load reads too."""
    config = read_json_object(model_dir / "config.json", f"{model_dir} is not a model directory: no config.json")
    _check_config(config, model_dir / "config.json")
    vocab = config["vocab_size"]
    _check_generation_config(model_dir / "generation_config.json", vocab)
    tokens = tokenizer_vocab_size(model_dir)
    if tokens is not None and tokens > vocab:
        raise SpecliteError(f"{model_dir}: its tokenizer has {tokens} tokens but the embedding table only {vocab} rows "
                            "(config vocab_size): the tokenizer does not belong to these weights")
    return config


def read_json_object(path: Path, missing: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecliteError(missing) from None
    except IsADirectoryError:
        raise SpecliteError(f"{path} is a directory, not a JSON file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecliteError(f"{path} is not valid JSON: {e}") from None
    except OSError as e:
        raise SpecliteError(f"cannot read {path}: {e.strerror}") from None
    if not isinstance(data, dict):
        raise SpecliteError(f"{path} must hold a JSON object, not a {type(data).__name__}")
    return data


def context_length(max_position_embeddings: int, max_model_len: int | None) -> int:
    """The KV cache length: --max-model-len, else the model's context capped at DEFAULT_CONTEXT."""
    if max_model_len is not None and (isinstance(max_model_len, bool) or not isinstance(max_model_len, int)):
        raise SpecliteError(f"--max-model-len must be an integer number of tokens, got {max_model_len!r}")
    if max_model_len is not None and max_model_len < 2:
        raise SpecliteError(f"--max-model-len must be at least 2 tokens, got {max_model_len}")
    if max_model_len and max_model_len > max_position_embeddings:
        raise SpecliteError(f"--max-model-len {max_model_len} exceeds the model's context of {max_position_embeddings}")
    return min(max_position_embeddings, max_model_len or DEFAULT_CONTEXT)


def tokenizer_vocab_size(model_dir: Path) -> int | None:
    """Ids ordinary text can encode to (highest + 1), checking the file's structure; None without one.

    Special added tokens are left out: some writers (GPTQModel) add a pad token past the
    embedding table, which text only reaches by spelling the token out.
    """
    path = model_dir / "tokenizer.json"
    if not path.exists():
        return None
    data = read_json_object(path, f"{path} is missing")
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    added = data.get("added_tokens") or []
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
        ids = list(vocab.values())
    elif isinstance(vocab, list):  # Unigram: [token, score] pairs, id = position
        ids = [len(vocab) - 1] if vocab else []
    else:
        raise SpecliteError(f"{path} is not a tokenizers file: 'model.vocab' must be an object or a list")
    if not isinstance(added, list) or not all(isinstance(t, dict) for t in added):
        raise SpecliteError(f"{path} is not a tokenizers file: 'added_tokens' must be a list of objects")
    ids += [t.get("id") for t in added if not t.get("special")]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise SpecliteError(f"{path} is not a tokenizers file: token ids must be non-negative integers")
    return max(ids, default=-1) + 1


def safetensors_headers(model_dir: Path) -> dict[str, dict]:
    """name -> {"dtype", "shape"} from every shard's header (a few KB read, no weights)."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json_object(index, f"{index} is missing").get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise SpecliteError(f"{index}: 'weight_map' must be an object of tensor name -> shard file name")
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise SpecliteError(f"{model_dir} holds no .safetensors weights")
    headers: dict[str, dict] = {}
    for file in files:
        headers.update(_read_header(file, model_dir))
    return headers


def _read_header(file: Path, model_dir: Path) -> dict[str, dict]:
    corrupt = f"{file} is corrupt or truncated; delete it and download it again"
    try:
        with open(file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                raise SpecliteError(corrupt)
            header = json.loads(f.read(length))
    except FileNotFoundError:
        raise SpecliteError(f"{model_dir}: weight shards missing: {file.name}") from None
    except (struct.error, ValueError, OSError):
        raise SpecliteError(corrupt) from None
    if not isinstance(header, dict):
        raise SpecliteError(corrupt)
    header.pop("__metadata__", None)
    if not all(isinstance(v, dict) and isinstance(v.get("shape"), list) for v in header.values()):
        raise SpecliteError(corrupt)
    return header


def _check_config(config: dict, path: Path) -> None:
    from speclite.model.decoder import architecture_family  # (the decoder imports the kernels)

    architecture_family(config)  # first: another architecture's config lacks our sizes, which would be named

    def size(name: str, required: bool) -> None:
        value = config.get(name)
        if value is None and not required:
            return
        if value is None:
            raise SpecliteError(f"{path} lacks '{name}'")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecliteError(f"{path}: '{name}' must be a positive integer, got {value!r}")

    for name in REQUIRED_SIZES:
        size(name, True)
    for name in OPTIONAL_SIZES:
        size(name, False)
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    if heads % kv_heads:
        raise SpecliteError(f"{path}: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})")
    if not config.get("head_dim") and config["hidden_size"] % heads:
        raise SpecliteError(f"{path}: hidden_size ({config['hidden_size']}) is not divisible by num_attention_heads ({heads})")
    for name in ("rms_norm_eps", "rope_theta"):
        _positive_number(config.get(name), path, name)
    for name in ("rope_scaling", "rope_parameters", "quantization_config"):
        if config.get(name) is not None and not isinstance(config[name], dict):
            raise SpecliteError(f"{path}: '{name}' must be an object")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    _positive_number(rope.get("rope_theta"), path, "rope_theta")
    for name in ROPE_FIELDS.get(kind, ()):
        if rope.get(name) is None:
            raise SpecliteError(f"{path}: RoPE scaling '{kind}' needs '{name}'")
        _positive_number(rope[name], path, f"rope {name}")


def _positive_number(value: object, path: Path, name: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise SpecliteError(f"{path}: '{name}' must be a positive number, got {value!r}")


def _check_generation_config(path: Path, vocab: int) -> None:
    if not path.exists():
        return
    eos = read_json_object(path, f"{path} is missing").get("eos_token_id")
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in ids):
        raise SpecliteError(f"{path}: 'eos_token_id' must be a token id (or a list of them) below {vocab}, got {eos!r}")


def _check_shapes(headers: dict, config: dict, model_dir: Path) -> None:
    """The tables whose rows are token ids: a mismatch would index out of range mid-run."""
    want = [config["vocab_size"], config["hidden_size"]]
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        entry = headers.get(name)
        if entry is not None and entry.get("dtype") in FLOAT_DTYPES and entry["shape"] != want:
            raise SpecliteError(f"{model_dir}: tensor '{name}' has shape {tuple(entry['shape'])}, but config.json "
                                f"(vocab_size, hidden_size) says {tuple(want)}")


# What a CPU run holds beside its weights and KV cache: activations, logits, the kernels' scratch
# (47-61 MB measured on Qwen2.5-0.5B's shape, tests/test_memory_check.py).
CPU_WORKING_BYTES = 64 << 20


def check_memory(headers: dict, config: dict, context: int, device: torch.device, dtype: torch.dtype,
                 model_dir: Path) -> None:
    """memory_needed against what is free."""
    weights, kv = memory_needed(headers, config, context, device, dtype)
    free = _free_memory(device)
    if free is not None and weights + kv > free:
        raise SpecliteError(
            f"{model_dir} needs {_gib(weights)} for its weights + {_gib(kv)} of KV cache ({context} tokens) but only "
            f"{_gib(free)} of {device.type} memory is free: use a smaller --max-model-len or a quant scheme (--quant int4)"
        )


def memory_needed(headers: dict, config: dict, context: int, device: torch.device, dtype: torch.dtype) -> tuple[int, int]:
    """(weights, KV cache): the most memory loading and running the model takes. The KV cache, and the
    weights (high-precision tensors at the run's dtype, packed ones as stored). On the CPU where the
    kernels run, also what loading and the kernels add (measured on Qwen2.5 shapes, within 5% of the
    peak): a float32 run holds every weight in float32 while it narrows the 16-bit ones (speclite.model.
    narrow, 1.5 copies of the largest at a time); after that each weight takes min(its stored size, the
    run's), the kernels' panels a second copy of every matrix (the tied head's too), the largest of them
    a third while it is packed; then 10% more (allocators and ISA paths differ: the measured peaks came
    within 5% of the sum) and CPU_WORKING_BYTES."""
    elem = torch.empty((), dtype=dtype).element_size()
    stored = loaded = kept = matrices = largest = largest_matrix = 0
    tied = config.get("tie_word_embeddings") and "lm_head.weight" not in headers
    for name, entry in headers.items():
        numel = math.prod(entry["shape"])
        if entry.get("dtype") not in FLOAT_DTYPES:  # packed: loaded as stored
            stored += numel * DTYPE_BYTES.get(entry.get("dtype"), 4)
            continue
        narrowed = numel * min(elem, DTYPE_BYTES[entry["dtype"]])
        loaded, kept, largest = loaded + numel * elem, kept + narrowed, max(largest, numel * elem)
        if len(entry["shape"]) == 2 and (name != "model.embed_tokens.weight" or tied):
            matrices, largest_matrix = matrices + narrowed, max(largest_matrix, narrowed)
    weights = stored + loaded
    if device.type == "cpu" and cpu_gemm.available():
        peak = max(loaded + largest * 3 // 2, kept + matrices + largest_matrix)
        weights = stored + peak * 11 // 10 + CPU_WORKING_BYTES  # + the allocator's rounding, the run's buffers
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return weights, 2 * config["num_hidden_layers"] * kv_heads * head_dim * context * elem


def _free_memory(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
