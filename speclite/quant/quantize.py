"""`speclite quantize` (a model dir -> a quantized model dir) and load-time `--quant`."""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from speclite.errors import SpecliteError
from speclite.model.decoder import ModelArgs
from speclite.model.loader import read_config, resolve_device
from speclite.model.tokenizer import load_tokenizer
from speclite.model.validate import check_checkpoint
from speclite.quant.blockwise import BlockRunner
from speclite.quant import calib as calibration
from speclite.quant.bnb import nf4_linear
from speclite.quant.fp8 import quantize_fp8_blocks
from speclite.quant.int4 import quantize_rtn, rtn_gptq
from speclite.quant.int8 import quantize_int8_channel
from speclite.quant.linear import Fp8Linear, Int4Linear, Int8Linear
from speclite.quant.schemes import (FP8_BLOCK, FP8_BLOCK_SIZE, INT4, LINEARS, LOAD_TIME_SCHEMES, NF4,
                                    check_method, normalize_scheme, quantization_config,
                                    quantized_bytes)
from speclite.quant.rows import chunk_workers
from speclite.quant.source import TensorSource, layer_index
from speclite.quant.gptq import GPTQMODEL_METHODS, GPTQMODEL_MIN_WINDOW
from speclite.quant.writer import SHARD_BYTES, ShardWriter, check_free_space, checkpoint_bytes, finish, prepare_out_dir

# Held-out tokens scored for perplexity: enough for a stable number, cheap on a 2-core CPU.
PPL_TOKENS = 2048
# The int4 group sizes transformers' GPTQ loader reads (its torch kernel's list; vLLM's Marlin: 32-128).
GPTQ_GROUP_SIZES = (16, 32, 64, 128, 256, 512, 1024)
_LINEAR_WEIGHT = re.compile(r"model\.layers\.\d+\.(" + "|".join(re.escape(n) for n in LINEARS) + r")\.weight")


@dataclass
class QuantReport:
    scheme: str
    method: str
    out_dir: str
    bytes_before: int  # safetensors bytes of the source checkpoint
    bytes_after: int  # safetensors bytes written
    ppl_before: float | None  # held-out perplexity; None when not evaluated (eval_skipped says why)
    ppl_after: float | None
    quantized_linears: int
    seconds: float  # the whole run
    quantize_seconds: float  # reading, quantizing and writing the weights (no tokenizer, no evaluation)
    eval_skipped: str | None = None


class QuantProgress:
    """What quantize_to_dir reports as it goes (no-ops here; the CLI renders a bar or plain lines)."""

    def start(self, tensors: int, nbytes: int) -> None:
        """`tensors` source tensors of `nbytes` bytes in total are about to be read."""

    def tensor(self, name: str, nbytes: int) -> None:
        """One source tensor is quantized (or copied) and handed to the writer."""

    def note(self, message: str) -> None:
        """A phase begins (calibration, GPTQModel, evaluation)."""

    def written(self, out_dir: Path) -> None:
        """The checkpoint is complete in out_dir (what follows is the evaluation)."""


def quantize_to_dir(model_dir, out_dir, scheme, method="rtn", group_size=128, sym=False, act_order=False,
                    alpha=0.5, calib=None, calib_samples=128, seq_len=512, shard_bytes=SHARD_BYTES,
                    evaluate=True, progress: QuantProgress | None = None) -> QuantReport:
    """Quantize model_dir into out_dir tensor by tensor (calibrated methods block by block).

    The checkpoint is written into a staging directory beside out_dir and renamed into place at the
    end: an interrupted run leaves nothing that loads as a model.
    """
    started = time.perf_counter()
    progress = progress or QuantProgress()
    scheme = normalize_scheme(scheme)
    method = check_method(scheme, method)
    _check_options(scheme, method, group_size, sym, act_order, alpha, calib, calib_samples, seq_len, shard_bytes)
    # OUT resolved: its staging directory beside the real directory (a link's target, "." by its name).
    model_dir, out_dir = Path(model_dir), Path(out_dir).resolve()
    config = check_checkpoint(model_dir)[0]  # a malformed checkpoint fails before any work
    args = ModelArgs.from_hf(config)
    if seq_len > args.max_position_embeddings:  # positions the model never reads would calibrate and score it
        seq_len = args.max_position_embeddings
        progress.note(f"--seq-len is past the model's context: windows of {seq_len} tokens")
    if config.get("quantization_config"):
        raise SpecliteError(f"{model_dir} is already quantized ({config['quantization_config'].get('quant_method')}); quantize the original model")
    calib_text = calibration.read_text(calib or calibration.SHIPPED_CALIB) if method != "rtn" else None
    tokenizer = _tokenizer(model_dir, required=method != "rtn") if method != "rtn" or evaluate else None
    device = resolve_device(None)
    windows = []
    if method != "rtn":
        windows = calibration.token_windows(tokenizer, calib_text, seq_len, calib_samples)
        longer = ""
        if method in GPTQMODEL_METHODS:
            windows = [w for w in windows if w.numel() > GPTQMODEL_MIN_WINDOW]
            longer = f" of more than {GPTQMODEL_MIN_WINDOW} tokens (GPTQModel drops shorter ones)"
        if not windows:
            raise SpecliteError(f"the calibration text is too short: it yields no token windows{longer}")

    source = TensorSource(model_dir)
    linears = {n for n in source.names() if _LINEAR_WEIGHT.fullmatch(n)}
    if not linears:
        raise SpecliteError(f"{model_dir}: found no decoder linear weights to quantize")
    if method == "awq":
        _check_awq_shapes({n: source.shapes[n] for n in linears}, group_size)
    staging = prepare_out_dir(model_dir, out_dir)
    writing = time.perf_counter()
    try:
        check_free_space(out_dir.parent, sum(quantized_bytes(scheme, source.shapes[n], group_size) if n in linears
                                             else source.nbytes[n] for n in source.names()))
        if method in GPTQMODEL_METHODS:
            from speclite.quant.gptq import gptqmodel_quantize

            progress.note(f"{method}: GPTQModel quantizes block by block (its per-layer log follows)")
            version = gptqmodel_quantize(model_dir, staging, windows, group_size, sym, act_order, device,
                                         shard_bytes, method)
            progress.note(f"{method}: written by GPTQModel {version}")
            finish(staging, out_dir, model_dir, None)
        else:
            writer = ShardWriter(staging, shard_bytes)
            progress.start(len(source.names()), sum(source.nbytes.values()))
            if method == "smoothquant":
                _stream_smoothed(source, args, windows, alpha, scheme, group_size, sym, writer, device, progress)
            else:
                with chunk_workers() as pool:
                    for name in source.names():
                        _emit(writer, scheme, name, source.get(name), group_size, sym, name in linears, pool)
                        progress.tensor(name, source.nbytes[name])
            writer.close()
            config = {**config, "quantization_config": quantization_config(scheme, group_size, sym, act_order)}
            finish(staging, out_dir, model_dir, config)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # Ctrl-C, an error: nothing half-written stays
        raise
    progress.written(out_dir)
    quantize_seconds = time.perf_counter() - writing
    ppl_before = ppl_after = None
    skipped = _eval_skipped(evaluate, tokenizer)
    if skipped is None:
        progress.note("perplexity of the original and the quantized model, block by block")
        heldout = calibration.token_windows(tokenizer, calibration.read_text(calibration.SHIPPED_HELDOUT),
                                            seq_len, max(1, PPL_TOKENS // seq_len))
        dtype = source_dtype(source)
        ppl_before = streamed_perplexity(source, args, heldout, dtype, device)
        ppl_after = streamed_perplexity(TensorSource(out_dir), args, heldout, dtype, device,
                                        read_config(out_dir)["quantization_config"])
    return QuantReport(scheme, method, str(out_dir), checkpoint_bytes(model_dir), checkpoint_bytes(out_dir),
                       ppl_before, ppl_after, len(linears), time.perf_counter() - started, quantize_seconds, skipped)


def _emit(writer: ShardWriter, scheme, name: str, tensor: torch.Tensor, group_size, sym, quantize: bool,
          pool=None) -> None:
    if not quantize:
        # Copied bit for bit in its own dtype, and out of the source's memory map: a pending view
        # would keep the whole input file mapped until its shard is written.
        writer.add(name, tensor.clone())
        return
    module = name[: -len(".weight")]
    for suffix, t in _quantized_tensors(scheme, module, tensor, group_size, sym, pool).items():
        writer.add(f"{module}.{suffix}", t)


def _stream_smoothed(source: TensorSource, args: ModelArgs, windows, alpha, scheme, group_size, sym,
                     writer: ShardWriter, device, progress: QuantProgress) -> None:
    """SmoothQuant block by block: calibrate block i on float32 weights, smooth it, write it, drop it."""
    from speclite.quant.calibrate import block_input_absmax
    from speclite.quant.smoothquant import CALIBRATED, smooth_block

    runner = BlockRunner(source, args, torch.float32, device)
    names = source.names()
    for name in names:
        if layer_index(name) is None:
            _emit(writer, scheme, name, source.get(name), group_size, sym, False)
            progress.tensor(name, source.nbytes[name])
    progress.note(f"smoothquant: {len(windows)} calibration windows, block by block")
    hidden = runner.embed(windows)
    for i in range(args.num_layers):
        block = runner.block(i)
        stats, hidden = block_input_absmax(runner, block, hidden, CALIBRATED)
        smooth_block(block, stats, alpha)
        params = dict(block.named_parameters())
        prefix = f"model.layers.{i}."
        for name in source.layer_names(i):
            local, linear = name[len(prefix):], _LINEAR_WEIGHT.fullmatch(name) is not None
            if local not in params:
                tensor = source.get(name)
            elif linear:
                tensor = params[local].detach()  # quantized from the smoothed float32 weight
            else:
                tensor = params[local].detach().to(source.get(name).dtype)  # a rescaled norm or bias
            _emit(writer, scheme, name, tensor, group_size, sym, linear)
            progress.tensor(name, source.nbytes[name])
        del block, params


def streamed_perplexity(source: TensorSource, args: ModelArgs, windows, dtype, device, qconfig=None) -> float:
    runner = BlockRunner(source, args, dtype, device, qconfig)
    hidden = runner.embed(windows)
    for i in range(args.num_layers):
        hidden = runner.run(runner.block(i), hidden)
    return runner.perplexity(hidden, windows)


def source_dtype(source: TensorSource) -> torch.dtype:
    """The checkpoint's own float dtype (its embeddings'), what the model runs in."""
    return source.get("model.embed_tokens.weight").dtype


def _eval_skipped(evaluate: bool, tokenizer) -> str | None:
    if not evaluate:
        return "skipped (--no-eval)"
    if tokenizer is None:
        return "n/a (no tokenizer)"
    return None


def _check_options(scheme, method, group_size, sym, act_order, alpha, calib, calib_samples, seq_len,
                   shard_bytes) -> None:
    if not isinstance(shard_bytes, int) or shard_bytes < 1:
        raise SpecliteError(f"the shard size must be a positive number of bytes, got {shard_bytes}")
    if scheme == INT4 and group_size not in GPTQ_GROUP_SIZES:  # what the checkpoint's other readers take
        raise SpecliteError(f"--group-size must be one of {', '.join(map(str, GPTQ_GROUP_SIZES))} (the group sizes "
                            f"transformers' GPTQ loader takes), got {group_size}")
    if act_order and method != "gptq":
        raise SpecliteError("--act-order needs --method gptq")
    if sym and method == "awq":
        raise SpecliteError("--sym does not apply to --method awq: AWQ's checkpoints keep zero points")
    if calib is not None and method == "rtn":
        raise SpecliteError("--calib is used only by --method gptq, awq or smoothquant; rtn needs no data")
    if not 0.0 <= alpha <= 1.0:
        raise SpecliteError(f"--alpha must lie in [0, 1], got {alpha}")
    if calib_samples < 1 or seq_len < 2:
        raise SpecliteError("--calib-samples must be >= 1 and --seq-len >= 2")
    if method in GPTQMODEL_METHODS and seq_len <= GPTQMODEL_MIN_WINDOW:
        raise SpecliteError(f"--method {method} needs --seq-len above {GPTQMODEL_MIN_WINDOW}: GPTQModel drops "
                            "shorter calibration windows")
    if sym and scheme != INT4:
        raise SpecliteError(f"--sym applies to int4 only ({scheme} is always symmetric)")


def _check_awq_shapes(shapes: dict[str, tuple[int, ...]], group_size: int) -> None:
    """GPTQModel's AWQ clips output rows 64 at a time and searches whole groups of input columns: a
    linear that does not divide so would stop it with an assertion deep inside, after the work before."""
    for name, (rows, columns) in sorted(shapes.items()):
        if rows % 64 or columns % group_size:
            raise SpecliteError(f"--method awq needs each linear's output size a multiple of 64 and input size a "
                                f"multiple of --group-size {group_size}: {name} is {rows} x {columns}")


def _tokenizer(model_dir: Path, required: bool):
    try:
        return load_tokenizer(model_dir, "calibration")
    except SpecliteError:
        if required:
            raise
        return None


def _quantized_tensors(scheme, module, weight, group_size, sym, pool=None) -> dict[str, torch.Tensor]:
    if scheme == FP8_BLOCK:
        values, scale = quantize_fp8_blocks(weight, FP8_BLOCK_SIZE, pool)
        return {"weight": values, "weight_scale_inv": scale}
    if scheme == INT4:
        return rtn_gptq(weight, group_size, sym, module, pool)
    q, scale = quantize_int8_channel(weight, pool)
    return {"weight": q, "weight_scale": scale}


def quantize_model(model, scheme, group_size=128, sym=False):
    """Load-time RTN (nf4: bitsandbytes' quantizer) of every decoder linear of a loaded Transformer.

    `scheme` is BODY or BODY/HEAD: lm_head stays high precision unless a HEAD scheme is named
    (e.g. "int4/w8a8": int4 linears, int8 head, as llama.cpp's Q4_0 keeps a 6-bit output tensor).
    """
    body, _, head = str(scheme).partition("/")
    body = normalize_scheme(body, LOAD_TIME_SCHEMES)
    if not isinstance(group_size, int) or group_size <= 0:
        raise SpecliteError(f"group size must be a positive integer, got {group_size}")
    for block in model.model.layers:
        for name in LINEARS:
            _replace(block, name, body, group_size, sym)
    if head:
        quantize_lm_head(model, head, group_size, sym)
    return model


def quantize_lm_head(model, scheme, group_size=128, sym=False):
    """lm_head at load time; the embeddings stay, so a tied head gets its own quantized copy."""
    _replace(model, "lm_head", normalize_scheme(scheme, LOAD_TIME_SCHEMES), group_size, sym)
    return model


def _replace(parent_module: nn.Module, name: str, scheme: str, group_size: int, sym: bool) -> None:
    new = quantized_linear(parent_module.get_submodule(name), scheme, group_size, sym, name)
    parent, _, attr = name.rpartition(".")
    setattr(parent_module.get_submodule(parent), attr, new)


def quantized_linear(linear: nn.Module, scheme: str, group_size: int = 128, sym: bool = False,
                     name: str = "lm_head") -> nn.Module:
    """A load-time quantized copy of a dense linear (`scheme` normalized); the linear itself stays."""
    if not isinstance(linear, nn.Linear):
        raise SpecliteError(f"--quant {scheme} needs a dense {name}: this one is already quantized")
    weight = linear.weight.detach()
    bias = None if linear.bias is None else linear.bias.detach()
    dtype, device = weight.dtype, weight.device
    if scheme == FP8_BLOCK:
        values, scale = quantize_fp8_blocks(weight, FP8_BLOCK_SIZE)
        new = Fp8Linear(values, scale, FP8_BLOCK_SIZE, bias, dtype, device)
    elif scheme == INT4:
        new = Int4Linear(quantize_rtn(weight, group_size, sym), bias, dtype, device)
    elif scheme == NF4:
        new = nf4_linear(weight, bias, dtype, device)
    else:
        q, scale = quantize_int8_channel(weight)
        new = Int8Linear(q, scale, bias, dtype, device)
    return new
