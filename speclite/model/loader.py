"""A model directory (config.json + sharded safetensors) -> a ready Transformer on a device."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from speclite.errors import SpecliteError
from speclite.model.decoder import ModelArgs, Transformer
from speclite.model.validate import check_model_dir, read_json_object

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_LAYER = re.compile(r"model\.layers\.(\d+)\.")
log = logging.getLogger(__name__)


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise SpecliteError(f"unknown device {device!r}: choose from auto, cpu, cuda (or cuda:N)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpecliteError("--device cuda was asked for but no CUDA GPU is available")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """bf16 on CUDA, float32 on the CPU unless asked otherwise."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise SpecliteError(f"unsupported dtype {dtype}: choose from auto, {', '.join(DTYPES)}")
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise SpecliteError(f"unknown dtype {dtype!r}: choose from auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def read_config(model_dir: Path) -> dict:
    return read_json_object(model_dir / "config.json", f"{model_dir} is not a model directory: no config.json")


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise SpecliteError(f"{index} is not a valid safetensors index: {e}") from None
        files = [model_dir / n for n in names]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise SpecliteError(f"{model_dir} holds no .safetensors weights")
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise SpecliteError(f"{model_dir}: weight shards missing: {', '.join(missing)}")
    return files


def read_tensors(model_dir: Path, keep: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint (or those whose name `keep` accepts), on the CPU as stored
    (memory-mapped where possible)."""
    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(model_dir):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if keep is None or keep(name):
                        tensors[name] = f.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise SpecliteError(f"{file} is corrupt or truncated ({e}); delete it and download it again") from None
    return tensors


def load_model(model_dir: str | Path, device: str | torch.device | None = None, dtype=None,
               max_model_len: int | None = None) -> Transformer:
    """Build the decoder from config.json and load its weights (quantized formats included).

    `max_model_len`: the KV cache length the caller will allocate (checked, with the weights,
    against free memory before any weight is read).
    """
    model_dir = Path(model_dir)
    device = device if isinstance(device, torch.device) else resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    config = check_model_dir(model_dir, device, dtype, max_model_len)
    args = ModelArgs.from_hf(config)
    tensors = read_tensors(model_dir)
    with torch.device("meta"):
        model = Transformer(args)
    qconfig = config.get("quantization_config")
    if qconfig:
        from speclite.quant.checkpoint import load_quantized_linears

        load_quantized_linears(model, qconfig, tensors, dtype, device)
    _load_dense(model, tensors, dtype, device, model_dir)
    model.tie_weights()
    model.init_rope(device)
    model.checkpoint_dir = model_dir
    _note_extra_layers(tensors, args.num_layers, model_dir)
    return model.eval()


def beyond_decoder(name: str, num_layers: int) -> bool:
    """A tensor shipped beside the decoder: an MTP module, at model.layers.{num_layers..} (DeepSeek-V3)
    or model.mtp_layers.* (MiMo). The target leaves them; --sp-type mtp reads them."""
    if name.startswith("model.mtp_layers."):
        return True
    layer = _LAYER.match(name)
    return layer is not None and int(layer.group(1)) >= num_layers


def _note_extra_layers(tensors: dict, num_layers: int, model_dir: Path) -> None:
    extra = sorted({".".join(n.split(".")[:3]) for n in tensors if beyond_decoder(n, num_layers)})
    if extra:
        log.warning(f"note: {model_dir} holds {', '.join(p + '.*' for p in extra)} beside the {num_layers} decoder "
                    "layers (MTP modules): the target does not use them; --sp-type mtp drafts with them")


def _load_dense(model: Transformer, tensors: dict, dtype, device, model_dir: Path) -> None:
    """Assign every remaining (unquantized) parameter from the checkpoint by its HF name."""
    params = dict(model.named_parameters())
    tied = model.args.tie_word_embeddings
    for name, param in params.items():
        if param.device.type != "meta":
            continue  # already filled by a quantized module
        if name == "lm_head.weight" and tied:
            continue
        if name not in tensors:
            raise SpecliteError(f"{model_dir}: checkpoint has no tensor '{name}'")
        value = tensors[name]
        if value.shape != param.shape:
            raise SpecliteError(f"{model_dir}: tensor '{name}' has shape {tuple(value.shape)}, config says {tuple(param.shape)}")
        if not value.is_floating_point() or value.element_size() == 1:
            # Integer or fp8 values without their scales would load as silently wrong weights.
            raise SpecliteError(f"{model_dir}: '{name}' is stored quantized ({value.dtype}), which speclite "
                                "loads only as a high-precision tensor")
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        # Always a copy: a tensor already in the right dtype would otherwise stay in the safetensors
        # memory map, whose page-cache pages streamed 16% slower than our own memory (CPU decode).
        weight = value.to(device=device, dtype=dtype, copy=True)
        setattr(module, attr, torch.nn.Parameter(weight, requires_grad=False))
