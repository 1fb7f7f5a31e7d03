"""Streamed quantization writes exactly what the formats define, block-streamed runs match whole models."""

from __future__ import annotations

import json
import math

import pytest
import torch
from quant_helpers import Recorder, save_tiny_model
from safetensors.torch import load_file

import speclite.quant.quantize as quantize_mod
from speclite.model import load_model
from speclite.model.decoder import ModelArgs
from speclite.model.loader import read_config
from speclite.model.tokenizer import load_tokenizer
from speclite.quant import calib, quantize_to_dir
from speclite.quant.blockwise import BlockRunner
from speclite.quant import rows
from speclite.quant.calibrate import block_input_absmax
from speclite.quant.fp8 import quantize_fp8_blocks
from speclite.quant.int4 import quantize_rtn, rtn_gptq, to_gptq
from speclite.quant.int8 import quantize_int8_channel
from speclite.quant.quantize import streamed_perplexity
from speclite.quant.smoothquant import CALIBRATED
from speclite.quant.source import TensorSource

FP8_MAX = 448.0


@pytest.fixture(autouse=True)
def short_perplexity(monkeypatch):
    monkeypatch.setattr(quantize_mod, "PPL_TOKENS", 256)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # hidden 96, intermediate 160: edge fp8 blocks and int4 groups are partial; bf16 like real checkpoints.
    path = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=96, intermediate=160, seed=7, tie=False)
    tensors = load_file(str(path / "model.safetensors"))
    from safetensors.torch import save_file

    save_file({k: v.bfloat16() for k, v in tensors.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


# References: the formats' definitions in plain (not in-place, not byte-level) torch, as the code before
# streaming computed them.

def ref_int4(w, gs, sym):
    n, k = w.shape
    groups = -(-k // gs)
    wp = torch.nn.functional.pad(w.float(), (0, groups * gs - k)).view(n, groups, gs)
    wmin, wmax = wp.amin(-1).clamp(max=0), wp.amax(-1).clamp(min=0)
    scale = 2 * torch.maximum(-wmin, wmax) / 15 if sym else (wmax - wmin) / 15
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).half().float()
    zero = torch.full_like(scale, 8) if sym else (-wmin / scale).round().clamp(1, 15)
    q = (torch.round(wp / scale[..., None]) + zero[..., None]).clamp(0, 15).view(n, -1)[:, :k].long()

    def pack(v):  # 8 values along the last dim -> one int32, lowest bits first
        v = v.reshape(*v.shape[:-1], -1, 8)
        words = sum(v[..., j] << (4 * j) for j in range(8))
        return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)

    return {"qweight": pack(q).t().contiguous(), "qzeros": pack((zero.t().long() - 1) & 0xF),
            "scales": scale.t().half(), "g_idx": (torch.arange(k) // gs).to(torch.int32)}


def ref_fp8(w):
    n, k = w.shape
    out, scales = torch.empty(n, k, dtype=torch.float8_e4m3fn), torch.empty(-(-n // 128), -(-k // 128))
    for i in range(0, n, 128):
        for j in range(0, k, 128):
            tile = w[i:i + 128, j:j + 128].float()
            amax = tile.abs().max()
            s = amax / FP8_MAX if amax > 0 else torch.tensor(1.0)
            scales[i // 128, j // 128] = s
            out[i:i + 128, j:j + 128] = (tile / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return {"weight": out, "weight_scale_inv": scales}


def ref_int8(w):
    amax = w.float().abs().amax(1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return {"weight": (w.float() / scale).round().clamp(-127, 127).to(torch.int8), "weight_scale": scale}


def read_all(path):
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def same(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.element_size() == 1:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return torch.equal(a, b)


@pytest.mark.parametrize("scheme,options", [("int4", {"group_size": 64}), ("int4", {"group_size": 32, "sym": True}),
                                            ("fp8-block", {}), ("w8a8", {})])
def test_streamed_checkpoint_equals_the_format_definition(tiny, tmp_path, scheme, options):
    out = tmp_path / "q"
    seen = Recorder()
    # Small shards: the streamed writer must split, index and name them like a single write.
    quantize_to_dir(tiny, out, scheme, shard_bytes=40_000, evaluate=False, progress=seen, **options)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 3
    written, source = read_all(out), load_file(str(tiny / "model.safetensors"))
    assert set(index["weight_map"]) == set(written)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in written.values())
    expected = {}
    for name, w in source.items():
        module = name[: -len(".weight")]
        if name.startswith("model.layers.") and "proj.weight" in name:
            ref = (ref_int4(w, options["group_size"], options.get("sym", False)) if scheme == "int4"
                   else ref_fp8(w) if scheme == "fp8-block" else ref_int8(w))
            expected.update({f"{module}.{k}": v for k, v in ref.items()})
        else:
            expected[name] = w  # bit for bit, in the checkpoint's dtype
    assert set(written) == set(expected)
    assert [n for n in expected if not same(written[n], expected[n])] == []
    assert len(seen.tensors) == len(source) and sum(b for _, b in seen.tensors) == seen.total[1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_row_chunks_on_worker_threads_change_no_value(monkeypatch, dtype):
    # Chunks of ~8 rows here: bands end inside fp8 block rows' worth of data, int4's last group is
    # partial (200 = 3 x 64 + 8), whole rows are zero and one row holds an outlier.
    monkeypatch.setattr(rows, "CHUNK_ELEMENTS", 2048)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(304, 200, generator=g) * torch.rand(304, 1, generator=g) * 0.1
    w[5:17] = 0
    w[40, 7] = 30.0
    w = w.to(dtype)
    with rows.chunk_workers() as pool:
        for p in (None, pool):
            for sym in (False, True):
                ref = ref_int4(w, 64, sym)
                packed = rtn_gptq(w, 64, sym, "w", p)
                assert all(same(packed[key], ref[key]) for key in ref), (p, sym)
                assert all(same(a, ref[key]) for key, a in to_gptq(quantize_rtn(w, 64, sym, p), "w").items())
            values, scale = quantize_fp8_blocks(w, (128, 128), p)
            assert same(values, ref_fp8(w)["weight"]) and same(scale, ref_fp8(w)["weight_scale_inv"])
            q, scale = quantize_int8_channel(w, p)
            assert same(q, ref_int8(w)["weight"]) and same(scale, ref_int8(w)["weight_scale"])


def windows(path, n=3, seq_len=48):
    tok = load_tokenizer(path)
    return calib.token_windows(tok, calib.read_text(calib.SHIPPED_HELDOUT), seq_len, n)


def test_block_by_block_calibration_sees_what_the_whole_model_sees(tiny):
    ws = windows(tiny)
    model = load_model(tiny, "cpu", torch.float32)
    whole = {}
    hooks = []
    for i, block in enumerate(model.model.layers):
        for name in CALIBRATED:
            def hook(module, args, key=(i, name)):
                amax = args[0].abs().reshape(-1, args[0].shape[-1]).amax(0)
                whole[key] = torch.maximum(whole[key], amax) if key in whole else amax
            hooks.append(block.get_submodule(name).register_forward_pre_hook(hook))
    with torch.no_grad():
        for w in ws:
            model(w, model.new_cache(w.numel()))
    args = ModelArgs.from_hf(read_config(tiny))
    runner = BlockRunner(TensorSource(tiny), args, torch.float32, torch.device("cpu"))
    hidden = runner.embed(ws)
    for i in range(args.num_layers):
        stats, hidden = block_input_absmax(runner, runner.block(i), hidden, CALIBRATED)
        for name in CALIBRATED:
            torch.testing.assert_close(stats[name], whole[(i, name)], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scheme", ["int4", "w8a8"])
def test_block_streamed_perplexity_equals_the_loaded_model(tiny, tmp_path, scheme):
    out = tmp_path / "q"
    quantize_to_dir(tiny, out, scheme, group_size=32, evaluate=False)
    ws = windows(tiny)
    args = ModelArgs.from_hf(read_config(tiny))
    for path, qconfig in ((tiny, None), (out, read_config(out)["quantization_config"])):
        model = load_model(path, "cpu", torch.bfloat16)
        total = count = 0
        with torch.no_grad():
            for w in ws:
                logits = model(w, model.new_cache(w.numel())).float()
                total += torch.nn.functional.cross_entropy(logits[:-1], w[1:], reduction="sum").item()
                count += w.numel() - 1
        streamed = streamed_perplexity(TensorSource(path), args, ws, torch.bfloat16, torch.device("cpu"), qconfig)
        assert streamed == pytest.approx(math.exp(total / count), rel=2e-3)


def test_report_in_the_checkpoint_dtype_and_no_eval(tiny, tmp_path):
    report = quantize_to_dir(tiny, tmp_path / "a", "w8a8")
    assert report.ppl_before is not None and report.ppl_after == pytest.approx(report.ppl_before, rel=0.05)
    skipped = quantize_to_dir(tiny, tmp_path / "b", "w8a8", evaluate=False)
    assert (skipped.ppl_before, skipped.ppl_after, skipped.eval_skipped) == (None, None, "skipped (--no-eval)")


def test_shards_written_tensor_by_tensor_load_with_safetensors_own_reader(tmp_path):
    """The writer's safetensors files (each tensor written from its own memory) read back exactly
    with safetensors' loader, for every dtype a checkpoint holds, odd layouts included."""
    from speclite.quant.writer import SAFETENSORS_DTYPES, write_safetensors

    g = torch.Generator().manual_seed(3)
    tensors = {f"t.{str(dtype)[6:]}": (torch.randn(5, 3, generator=g) * 40).to(dtype) for dtype in SAFETENSORS_DTYPES}
    tensors.update({"transposed": torch.randn(4, 6, generator=g).t(), "scalar": torch.tensor(2.5), "empty": torch.empty(0, 7),
                    "odd": torch.randint(0, 255, (3,), dtype=torch.uint8, generator=g)})
    write_safetensors(tmp_path / "x.safetensors", tensors, {"format": "pt"})
    back = load_file(str(tmp_path / "x.safetensors"))
    assert back.keys() == tensors.keys()
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        assert torch.equal(back[name].reshape(-1).view(torch.uint8), t.contiguous().reshape(-1).view(torch.uint8)), name
