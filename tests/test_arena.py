"""The weights' huge-page arena (speclite.model.arena): the same numbers, ties kept, one copy of
what models share, and what LLM reports as resident unchanged."""

from __future__ import annotations

import mmap

import pytest
import torch
from torch import nn

from speclite.api import LLM, SpecConfig
from speclite.engine.memory import model_bytes
from speclite.model import arena, load_model
from speclite.quant import quantize_model

pytestmark = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="Linux's madvise(MADV_HUGEPAGE) only")


def cpu_tensors(model):
    return [t for t in list(model.parameters()) + list(model.buffers()) if t.numel()]


def inside(t: torch.Tensor, region: torch.Tensor) -> bool:
    return region.data_ptr() <= t.data_ptr() and t.data_ptr() + t.nbytes <= region.data_ptr() + region.nbytes


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding `address` (/proc/self/smaps)."""
    found = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            found = lo <= address < hi
        elif found and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("family", ["qwen2", "llama"])  # tied and untied embeddings
@pytest.mark.parametrize("quant", [None, "int4/w8a8", "w8a8"])
def test_settled_weights_give_the_same_logits(model_dirs, family, quant):
    def loaded():
        model = load_model(model_dirs[family], "cpu", torch.float32)
        return quantize_model(model, quant, group_size=32) if quant else model

    before, after = loaded(), loaded()
    region = arena.settle(after)
    assert region is not None and "hg" in vm_flags(region.data_ptr())  # advised for huge pages
    assert all(inside(t, region) for t in cpu_tensors(after))
    assert model_bytes(after) == model_bytes(before)
    if before.lm_head.weight is before.model.embed_tokens.weight:  # tied (unless the head was quantized)
        assert after.lm_head.weight is after.model.embed_tokens.weight
    prompt = torch.randint(0, after.args.vocab_size, (11,), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = before(prompt, before.new_cache(16))
        got = after(prompt, after.new_cache(16))
    assert torch.equal(got, expected)


def test_what_models_share_is_copied_once(model_dirs):
    target = load_model(model_dirs["llama"], "cpu", torch.float32)
    embed = target.model.embed_tokens
    head = nn.Sequential(embed, nn.Linear(4, 3))  # a head holding the target's embedding module
    tied = nn.Linear(embed.weight.shape[1], embed.weight.shape[0], bias=False)
    tied.weight = embed.weight  # the same parameter in a module of another model
    unique = {t.data_ptr(): t.nbytes for t in cpu_tensors(target) + cpu_tensors(head[1])}
    region = arena.settle(target, head, tied)
    assert head[0] is embed and tied.weight is embed.weight and inside(embed.weight, region)
    laid_out = sum(-(-n // 64) * 64 for n in unique.values())
    assert region.nbytes == -(-laid_out // (2 << 20)) * (2 << 20)  # each tensor once


def test_llm_reports_the_same_resident_bytes(pair):
    target, draft = pair
    llm = LLM(target, SpecConfig(method="vanilla", k=3, draft=str(draft)), device="cpu")
    held = [load_model(path, "cpu", torch.float32) for path in pair]
    memory = llm.memory()
    assert memory["weights"] == model_bytes(held[0]) and memory["draft_weights"] == model_bytes(held[1])
    drafted = llm.engine.spec.proposer.resident()[0][0]
    region = cpu_tensors(llm.target)[0]
    assert all(t.untyped_storage().data_ptr() == region.untyped_storage().data_ptr()
               for t in cpu_tensors(llm.target) + cpu_tensors(drafted))  # one arena for both


class NoAdvice(mmap.mmap):
    def madvise(self, *args):
        raise OSError(22, "Invalid argument")  # a kernel built without THP


def no_room(*args, **kwargs):
    raise OSError(12, "Cannot allocate memory")  # strict overcommit


@pytest.mark.parametrize("mapping, settles", [(no_room, False), (NoAdvice, True)])
def test_a_refused_mapping_or_advice_loses_nothing(model_dirs, monkeypatch, mapping, settles):
    model = load_model(model_dirs["llama"], "cpu", torch.float32)
    held = cpu_tensors(model)
    monkeypatch.setattr(arena.mmap, "mmap", mapping)
    region = arena.settle(model)
    assert (region is not None) == settles
    assert all((t is old) != settles for t, old in zip(cpu_tensors(model), held))
    assert all(torch.equal(t, old) for t, old in zip(cpu_tensors(model), held))


def test_nothing_to_move_is_no_arena():
    assert arena.settle(nn.Module()) is None
