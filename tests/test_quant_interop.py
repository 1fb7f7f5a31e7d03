"""Published-style checkpoints (GPTQ v2, AWQ GEMM) built here by hand load like our GPTQ v1."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from quant_helpers import logits, rel_err, save_tiny_model
from safetensors.torch import load_file, save_file

import speclite.quant.quantize as quantize_mod
from speclite.errors import SpecliteError
from speclite.model import load_model
from speclite.model.decoder import Linear
from speclite.quant import quantize_to_dir

GROUP = 32
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i of an AWQ word holds column AWQ_ORDER[i]


@pytest.fixture(scope="module")
def v1(tmp_path_factory):
    root = tmp_path_factory.mktemp("interop")
    model = save_tiny_model(root / "model", hidden=64, intermediate=160, seed=2, family="llama", tie=False)
    quantize_mod.PPL_TOKENS, saved = 64, quantize_mod.PPL_TOKENS
    try:
        quantize_to_dir(model, root / "v1", "int4", group_size=GROUP)
    finally:
        quantize_mod.PPL_TOKENS = saved
    return root / "v1"


# Independent numpy codec, written from the format definitions (not from speclite's packer).
def unpack_rows(words):  # [R, C] int32 -> [8R, C]: 8 values per word along rows, lowest bits first
    u = words.astype(np.int64) & 0xFFFFFFFF
    return np.stack([(u >> (4 * i)) & 0xF for i in range(8)], axis=1).reshape(-1, u.shape[1])


def unpack_cols(words):  # [R, C] -> [R, 8C]
    u = words.astype(np.int64) & 0xFFFFFFFF
    return np.stack([(u >> (4 * i)) & 0xF for i in range(8)], axis=2).reshape(u.shape[0], -1)


def pack_cols(values, order=range(8)):  # [R, 8C] -> [R, C]; nibble i takes column order[i] of each 8
    v = values.astype(np.int64).reshape(values.shape[0], -1, 8)
    word = sum(v[:, :, c] << (4 * i) for i, c in enumerate(order))
    return torch.from_numpy(word.astype(np.uint32).view(np.int32))


def pack_rows(values):
    return pack_cols(values.T).t().contiguous()


def _rewrite(v1, out, qconfig, convert):
    out.mkdir()
    for f in v1.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            shutil.copy(f, out / f.name)
    config = json.loads((v1 / "config.json").read_text())
    config["quantization_config"] = qconfig
    (out / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(v1 / "model.safetensors"))
    new = {}
    for name, t in tensors.items():
        if name.endswith(".qweight"):
            module = name[: -len(".qweight")]
            q = unpack_rows(tensors[name].numpy())  # [K, N]
            zeros = unpack_cols(tensors[f"{module}.qzeros"].numpy()) + 1  # v1 stores zero - 1
            new.update(convert(module, q, zeros, tensors[f"{module}.scales"]))
        elif not name.endswith((".qzeros", ".scales", ".g_idx")):
            new[name] = t
    save_file(new, str(out / "model.safetensors"))
    return out


def test_gptq_v2_loads_like_v1(v1, tmp_path):
    def convert(module, q, zeros, scales):
        k = q.shape[0]
        return {f"{module}.qweight": pack_rows(q), f"{module}.qzeros": pack_cols(zeros), f"{module}.scales": scales,
                f"{module}.g_idx": torch.arange(k, dtype=torch.int32) // GROUP}

    qconfig = {**json.loads((v1 / "config.json").read_text())["quantization_config"], "checkpoint_format": "gptq_v2"}
    v2 = _rewrite(v1, tmp_path / "v2", qconfig, convert)
    tokens = torch.randint(0, 300, (16,))
    torch.testing.assert_close(logits(load_model(v2), tokens), logits(load_model(v1), tokens), rtol=0, atol=0)


def test_awq_gemm_loads_like_v1(v1, tmp_path):
    def convert(module, q, zeros, scales):
        return {f"{module}.qweight": pack_cols(q, AWQ_ORDER), f"{module}.qzeros": pack_cols(zeros, AWQ_ORDER),
                f"{module}.scales": scales}

    qconfig = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm",
               "modules_to_not_convert": None}
    awq = _rewrite(v1, tmp_path / "awq", qconfig, convert)
    assert load_file(str(awq / "model.safetensors"))["model.layers.0.mlp.up_proj.qweight"].shape == (64, 160 // 8)
    tokens = torch.randint(0, 300, (16,))
    torch.testing.assert_close(logits(load_model(awq), tokens), logits(load_model(v1), tokens), rtol=0, atol=0)


def test_ignored_modules_stay_dense_and_bad_configs_fail(v1, tmp_path):
    dense_mlp = "model.layers.1.mlp.down_proj"

    def convert(module, q, zeros, scales):
        if module == dense_mlp:  # a checkpoint that left this linear unquantized
            g = torch.from_numpy(np.arange(q.shape[0]) // GROUP)
            w = (torch.from_numpy(q).float() - torch.from_numpy(zeros).float()[g]) * scales.float()[g]
            return {f"{module}.weight": w.t().contiguous()}
        return {f"{module}.qweight": pack_rows(q), f"{module}.qzeros": pack_cols(zeros), f"{module}.scales": scales}

    qconfig = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "checkpoint_format": "gptq_v2",
               "modules_to_not_convert": [dense_mlp]}
    mixed = _rewrite(v1, tmp_path / "mixed", qconfig, convert)
    model = load_model(mixed)
    assert type(model.get_submodule(dense_mlp)) is Linear  # our dense linear, not a QuantLinear
    assert type(model.get_submodule("model.layers.1.mlp.up_proj")).__name__ == "Int4Linear"
    tokens = torch.randint(0, 300, (16,))
    # Equal weights; only that layer's matmul differs (fp32 dense vs the int4 path's bf16 or
    # int8-per-32 activations).
    assert rel_err(logits(model, tokens), logits(load_model(v1), tokens)) < 3e-3

    config = json.loads((mixed / "config.json").read_text())
    config["quantization_config"]["bits"] = 3
    (mixed / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecliteError, match="3 bits"):
        load_model(mixed)
