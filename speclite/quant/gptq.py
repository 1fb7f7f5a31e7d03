"""`--method gptq` and `--method awq` through GPTQModel, the maintained successor of AutoGPTQ (extra
`speclite[gptq]`).

GPTQModel runs the algorithm (GPTQ: Hessians, error feedback, act-order; AWQ: per-channel scales
searched on the calibration activations and folded into the preceding norm or linear, then the
clipping search) and writes the checkpoint (GPTQ's v1 zero-point convention, AWQ's GEMM packing)
with its tokenizer and configs; speclite chooses the calibration windows and loads the result like
any published GPTQ or AWQ model. It is imported only here, on demand: it
pulls in datasets/pandas/pyarrow and pins an older numpy, so the base install stays without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
import tempfile
from pathlib import Path

import torch

from speclite.errors import SpecliteError
from speclite.quant.source import TensorSource, layer_index
from speclite.quant.writer import ShardWriter

INSTALL_HINT = "pip install 'speclite[gptq]' -c constraints.txt"
# The --method values GPTQModel runs.
GPTQMODEL_METHODS = ("gptq", "awq")
# GPTQModel drops calibration windows of this many tokens or fewer (7.6 takes no other minimum: its
# quantize() accepts calibration_data_min_length but does not pass it on).
GPTQMODEL_MIN_WINDOW = 10


def gptqmodel_quantize(model_dir: Path, out_dir: Path, windows: list[torch.Tensor], group_size: int, sym: bool,
                       act_order: bool, device: torch.device, shard_bytes: int, method: str = "gptq") -> str:
    """Quantize every decoder linear of model_dir to 4 bits with `method` (gptq, awq) into out_dir;
    returns GPTQModel's version."""
    # GPTQModel sizes its CPU worker pool from this and stalls on a 2-core machine without it.
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(1, os.cpu_count() or 1)))
    model_dir, out_dir = Path(model_dir).resolve(), Path(out_dir).resolve()
    # GPTQModel prints a banner and per-layer progress on stdout, which belongs to speclite's report,
    # and writes run logs under ./logs: run it from a scratch directory so the user's cwd stays clean.
    with contextlib.redirect_stdout(sys.stderr), tempfile.TemporaryDirectory() as scratch, _cwd(scratch):
        try:
            gptqmodel, GPTQModel, QuantizeConfig = _import_gptqmodel()
        except ImportError as e:
            raise SpecliteError(f"--method {method} needs GPTQModel ({e.name or e} is missing): {INSTALL_HINT}") from None
        from gptqmodel.quantization.config import FORMAT, METHOD
        from gptqmodel.utils.backend import BACKEND

        # offload_to_disk (GPTQModel 7.6's default, pinned here): load() builds the model on
        # meta and reads each block from the checkpoint when it is quantized, then offloads it to
        # disk, so peak memory is one block, its Hessians (AWQ: its activations) and the embeddings.
        offload = dict(offload_to_disk=True, offload_to_disk_path=os.path.join(scratch, "offload"))
        if method == "awq":
            config = QuantizeConfig(bits=4, group_size=group_size, sym=False, quant_method=METHOD.AWQ, format=FORMAT.GEMM,
                                    **offload)  # sym=False: zero points, as AWQ checkpoints keep them
        else:
            config = QuantizeConfig(bits=4, group_size=group_size, sym=sym, desc_act=act_order, **offload)
        # Off CUDA, GPTQModel checks AWQ's CUDA GEMM kernel before it starts unless its torch kernel packs.
        backend = BACKEND.AWQ_TORCH if method == "awq" and device.type != "cuda" else BACKEND.AUTO
        calibration = [{"input_ids": w.tolist(), "attention_mask": [1] * w.numel()} for w in windows]
        model = GPTQModel.load(str(model_dir), config, device=str(device))
        model.layer_callback = _release_freed_heap
        model.quantize(calibration, batch_size=1, backend=backend)
        outside = _drop_outside_blocks(model.model)
        model.save(str(out_dir), max_shard_size=shard_bytes)
    _add_from_source(model_dir, out_dir, outside, shard_bytes)
    return gptqmodel.__version__


# GPTQModel's import (its tokenizer helper, tokenicer) points these at /tmp for the whole process, so a
# later download or a child process would use another cache than the user's: they are put back.
HF_CACHE_ENV = ("HF_HOME", "HF_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_MODULES_CACHE")


def _import_gptqmodel():
    """(gptqmodel, GPTQModel, QuantizeConfig), the process's Hugging Face cache variables as they were."""
    saved = {name: os.environ.get(name) for name in HF_CACHE_ENV}
    try:
        import gptqmodel
        from gptqmodel import GPTQModel, QuantizeConfig
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return gptqmodel, GPTQModel, QuantizeConfig


def _drop_outside_blocks(model: torch.nn.Module) -> list[tuple[list[str], torch.dtype]]:
    """Take the parameters outside the decoder blocks (embeddings, final norm, lm_head) off the model
    GPTQModel saves: [(the names of one tensor, tied ones together), the dtype it would write]. Its save
    reads each of them whole from the checkpoint and copies it before writing (~520 MB above the
    quantize loop at the 0.5B shape); _add_from_source streams them from the checkpoint instead."""
    groups: dict[int, tuple[list[str], torch.dtype]] = {}
    for name, param in list(model.named_parameters(remove_duplicate=False)):
        if layer_index(name) is None:
            groups.setdefault(id(param), ([], param.dtype))[0].append(name)
            module_path, _, leaf = name.rpartition(".")
            model.get_submodule(module_path)._parameters[leaf] = None
    return list(groups.values())


def _add_from_source(model_dir: Path, out_dir: Path, groups: list[tuple[list[str], torch.dtype]],
                     shard_bytes: int) -> None:
    """GPTQModel's shards, plus one tensor per group read from the source checkpoint (the name it has
    there; tied names share it) in the dtype GPTQModel would have written, shards of the same size; one index."""
    source, written = TensorSource(model_dir), TensorSource(out_dir)
    writer = ShardWriter(out_dir, shard_bytes)
    held: dict[Path, list[str]] = {}
    for name, file in written.files().items():
        held.setdefault(file, []).append(name)
    for file, names in held.items():
        writer.adopt(file, names, sum(written.nbytes[n] for n in names))
    (out_dir / "model.safetensors.index.json").unlink(missing_ok=True)
    for names, dtype in groups:
        name = next((n for n in names if n in source.shapes), None)
        if name is None:
            raise SpecliteError(f"{model_dir}: the checkpoint has no tensor for {' / '.join(names)}")
        writer.add(name, source.get(name).to(dtype))
    writer.close()


def _release_freed_heap(layer_idx: int, submodule_finalized: bool) -> None:
    """GPTQModel's layer-done hook: hand the memory the block freed back to the OS.

    Each block frees its float weights, Hessians and activations, but glibc keeps the freed pages in its
    arenas (the worker threads') for reuse: resident memory grew ~40 MB per 0.5B-shape block
    (905 -> 1380 MB over 12 blocks) and the peak with it, though no tensor outlives its block.
    malloc_trim returns those pages: the same run stays at 770-800 MB between blocks.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _malloc_trim():
    """glibc's malloc_trim, or None (musl, macOS: nothing to trim this way)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim", None)
    except OSError:
        return None


_MALLOC_TRIM = _malloc_trim()


@contextlib.contextmanager
def _cwd(path: str):
    """contextlib.chdir, which needs Python 3.11."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)
