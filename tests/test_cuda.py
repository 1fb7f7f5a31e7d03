"""On a CUDA GPU: every Triton kernel compiled (not interpreted) against its torch path, and greedy
speculative output equal to plain decoding for each method, dynamic and CUDA-graph (--static) steps,
float32 and quantized. Marked `cuda`: skipped without a GPU; run alone with `pytest -m cuda` (the
kernel modules of the CPU suite switch Triton to its interpreter when they are imported, so a
`-m cuda` session does not collect them: tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from layer_ops_reference import decoders_rope_cache, torch_rms_norm

import speclite
from speclite import LLM, SamplingParams
from speclite import kernels
from speclite.kernels import dispatch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available() or not dispatch.triton_available(),
                                 reason="needs a CUDA GPU and triton")]

ROWS = [1, 2, 5, 9]  # a decode step and k + 1 = 2..9 verification rows
GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)


def both_paths(fn, *args):
    """fn's output through the Triton kernel and through its torch path, on the same CUDA tensors."""
    kernel = fn(*args)
    kernels.force_torch(True)
    try:
        reference = fn(*args)
    finally:
        kernels.force_torch(False)
    return kernel, reference


def cuda_gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("k,n,group,act_order", [(896, 4864, 128, False), (4864, 896, 128, True), (264, 40, 32, False)])
def test_w4a16_kernel_equals_its_torch_path(m, k, n, group, act_order):
    g = cuda_gen(m + k)
    groups = -(-k // group)
    qweight = torch.randint(-2**31, 2**31 - 1, (k // 8, n), generator=g, device="cuda", dtype=torch.int64).to(torch.int32)
    qzeros = torch.randint(-2**31, 2**31 - 1, (groups, n // 8), generator=g, device="cuda",
                           dtype=torch.int64).to(torch.int32)
    scales = (torch.rand(groups, n, generator=g, device="cuda") * 0.02 + 0.005).half()
    g_idx = (torch.randperm(k, generator=g, device="cuda") // group).int() if act_order else None
    for dtype in (torch.float16, torch.bfloat16):
        x = (torch.randn(m, k, generator=g, device="cuda") * 0.5).to(dtype)
        y, ref = both_paths(kernels.w4a16_gemm, x, qweight, qzeros, scales, g_idx, group)
        assert y.dtype == dtype and y.shape == (m, n)
        torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.float().abs().mean().item())


@pytest.mark.parametrize("k,n", [(3584, 4608), (896, 136)])
def test_dense_gemm_compiled_equals_torch_and_rows_stand_alone(k, n):
    """kernels.linear's Triton GEMM for decode and verification rows (tuned as the model runs it):
    torch's matmul within rounding, the bias added, and each row of a 9-row call its one-row call's."""
    g = cuda_gen(k + n)
    for dtype in (torch.bfloat16, torch.float16):
        w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(dtype)
        b = torch.randn(n, generator=g, device="cuda").to(dtype)
        x = torch.randn(9, k, generator=g, device="cuda").to(dtype)
        y = kernels.linear(x, w, b)
        ref = F.linear(x.float(), w.float(), b.float())
        torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().mean().item())
        assert torch.equal(torch.cat([kernels.linear(x[i:i + 1], w, b) for i in range(9)]), y)
        # Eight splits summed by whichever finishes last, in split order: the same bits every call.
        from speclite.kernels import dense_triton
        from speclite.kernels.tuning import GemmConfig

        split = [dense_triton.dense_gemm(x, w, b, GemmConfig(16, 64, 64, 8)) for _ in range(20)]
        assert all(torch.equal(s, split[0]) for s in split)
        torch.testing.assert_close(split[0].float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().mean().item())


@pytest.mark.parametrize("block_k", [64, 128, 256])
def test_w4a16_tile_kinds_compiled_and_rows_independent(block_k):
    """Each way a W4A16 tile is worked, compiled: BLOCK_K 64 and 128 inside a 128-channel group
    (integer weights, the scale after the dot; 128 loads each packed word once) and 256 (groups
    gathered per channel). Against the torch path, and each row alone bit for bit its row of a
    9-row call: a verification's tokens are the plain steps' tokens."""
    from speclite.kernels import w4a16_triton
    from speclite.kernels.tuning import GemmConfig

    g, k, n = cuda_gen(block_k), 3584, 1024
    qweight = torch.randint(-2**31, 2**31 - 1, (k // 8, n), generator=g, device="cuda", dtype=torch.int64).to(torch.int32)
    qzeros = torch.randint(-2**31, 2**31 - 1, (k // 128, n // 8), generator=g, device="cuda",
                           dtype=torch.int64).to(torch.int32)
    scales = (torch.rand(k // 128, n, generator=g, device="cuda") * 0.02 + 0.005).half()
    config = GemmConfig(16, 64, block_k, 4)
    for dtype in (torch.float16, torch.bfloat16):
        x = (torch.randn(9, k, generator=g, device="cuda") * 0.5).to(dtype)
        y = w4a16_triton.w4a16_gemm(x, qweight, qzeros, scales, None, 128, config=config)
        kernels.force_torch(True)
        try:
            ref = kernels.w4a16_gemm(x, qweight, qzeros, scales, None, 128)
        finally:
            kernels.force_torch(False)
        torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.float().abs().mean().item())
        alone = [w4a16_triton.w4a16_gemm(x[i:i + 1], qweight, qzeros, scales, None, 128, config=config) for i in range(9)]
        assert torch.equal(torch.cat(alone), y)


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("k,n", [(896, 4864), (3584, 512), (200, 136)])
def test_fp8_block_kernel_equals_its_torch_path(m, k, n):
    if not dispatch.fp8_dot_supported(torch.empty(0, device="cuda")):
        pytest.skip("fp8 tl.dot needs compute capability 8.9")
    g = cuda_gen(m * 7 + k)
    weight = (torch.randn(n, k, generator=g, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    scale_inv = torch.rand(-(-n // 128), -(-k // 128), generator=g, device="cuda") * 0.01 + 0.001
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    (xq, xs), (xq_ref, xs_ref) = both_paths(kernels.per_token_group_quant_fp8, x, 128)
    torch.testing.assert_close(xq.float(), xq_ref.float())
    torch.testing.assert_close(xs, xs_ref)
    y, ref = both_paths(kernels.fp8_block_gemm, x, weight, scale_inv)
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.float().abs().mean().item())


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("k,n", [(896, 4864), (4864, 896), (200, 136)])
def test_int8_kernel_equals_its_torch_path(m, k, n):
    g = cuda_gen(m * 11 + k)
    weight = torch.randint(-127, 128, (n, k), generator=g, device="cuda", dtype=torch.int8)
    scale = torch.rand(n, 1, generator=g, device="cuda") * 0.01 + 0.001
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    (q, sx), (q_ref, sx_ref) = both_paths(kernels.per_token_quant_int8, x)
    assert torch.equal(q, q_ref)
    torch.testing.assert_close(sx, sx_ref)
    y, ref = both_paths(kernels.int8_gemm, x, weight, scale)
    # Integer dot products are exact: only the epilogue's rounding may differ.
    torch.testing.assert_close(y.float(), ref.float(), rtol=1e-2, atol=1e-2 * ref.float().abs().mean().item())


@pytest.mark.parametrize("k", [1, 4, 8])
def test_verify_kernels_equal_their_torch_paths(k):
    g = cuda_gen(k)
    vocab = 151936
    for trial in range(20):
        logits = torch.randn(k + 1, vocab, generator=g, device="cuda")
        best = logits.argmax(-1)
        accepted = trial % (k + 1)  # every acceptance length, then a draft that differs
        drafts = best[:k].clone()
        if accepted < k:
            drafts[accepted] = (drafts[accepted] + 1) % vocab
        n, token = kernels.verify_greedy(drafts, logits)  # torch's ops on every device
        assert int(n) == accepted and int(token) == int(best[accepted])
        p = torch.softmax(logits * 2, -1)
        q = torch.softmax(torch.randn(k, vocab, generator=g, device="cuda") * 2, -1)
        u = torch.rand(k, generator=g, device="cuda")
        r = torch.rand((), generator=g, device="cuda")
        out, ref = both_paths(kernels.verify_rejection, drafts, q, p, u, r)
        assert [int(v) for v in out] == [int(v) for v in ref]


@pytest.mark.parametrize("qk_norm", [False, True], ids=["rope", "qk-norm+rope"])
@pytest.mark.parametrize("static", [False, True], ids=["start", "slots"])
def test_gpu_layer_ops_equal_the_decoders_torch_code(qk_norm, static):
    """RMSNorm, SiLU-and-multiply and norms + RoPE + cache write, compiled, in bf16 against the
    decoder's torch ops on the same CUDA tensors; RoPE alone rounds as they do: the same bits."""
    from speclite.kernels import gpu_layer_ops
    from speclite.model.decoder import rope_tables

    g = cuda_gen(11 + 2 * qk_norm + static)
    h, kv, d, t, first, max_len = 28, 4, 128, 5, 40, 64  # Qwen2.5-7B's heads
    bf16 = torch.bfloat16
    x = torch.randn(t, 3584, generator=g, device="cuda").to(bf16)
    w = (torch.rand(3584, generator=g, device="cuda") + 0.5).to(bf16)
    torch.testing.assert_close(gpu_layer_ops.rms_norm(x, w, 1e-6), torch_rms_norm(x, w, 1e-6), rtol=1e-2, atol=1e-2)
    delta = torch.randn(t, 3584, generator=g, device="cuda").to(bf16)
    total, normed = gpu_layer_ops.add_rms_norm(x, delta, w, 1e-6)
    assert torch.equal(total, x + delta)  # rounded as torch's add
    torch.testing.assert_close(normed, torch_rms_norm(x + delta, w, 1e-6), rtol=1e-2, atol=1e-2)
    gate_up = (torch.randn(t, 2 * 18944, generator=g, device="cuda") * 3).to(bf16)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(gpu_layer_ops.silu_mul(gate_up), F.silu(gate) * up, rtol=1e-2, atol=1e-2)
    qkv = torch.randn(t, (h + 2 * kv) * d, generator=g, device="cuda").to(bf16)
    inv_freq = 1.0 / 1e6 ** (torch.arange(0, d, 2, dtype=torch.float32, device="cuda") / d)
    cos, sin = rope_tables(torch.arange(first, first + t, device="cuda"), inv_freq, 1.0, bf16)
    norms = (((torch.rand(d, generator=g, device="cuda") + 0.5).to(bf16),
              (torch.rand(d, generator=g, device="cuda") + 0.5).to(bf16)), 1e-6) if qk_norm else ()
    start = torch.arange(first, first + t, device="cuda") if static else first
    cache_k, cache_v = torch.randn(2, kv, max_len, d, generator=g, device="cuda").to(bf16)
    ref_k, ref_v = cache_k.clone(), cache_v.clone()
    q = gpu_layer_ops.rope_cache(qkv, cos, sin, cache_k, cache_v, start, h, kv, norms)
    q_ref = decoders_rope_cache(qkv, cos, sin, ref_k, ref_v, start, h, kv, norms)
    assert torch.equal(cache_v, ref_v)
    if qk_norm:
        torch.testing.assert_close(q, q_ref, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(cache_k, ref_k, rtol=1e-2, atol=1e-2)
    else:
        assert torch.equal(q, q_ref) and torch.equal(cache_k, ref_k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("first", [40, 700])  # one chunk of keys; three
def test_attention_compiled_is_the_decoders_and_rows_stand_alone(dtype, first):
    """The decode / verification attention compiled, from q/k/v projections: the decoder's torch code
    (RoPE, cache write) and float64 attention within rounding; each causal row its one-row step's bits,
    the cache the same; a CUDA-graph step (slots, a span-wide mask) the dynamic step's bits."""
    from speclite.kernels import gpu_layer_ops
    from speclite.model.decoder import rope_tables

    g = cuda_gen(first + (dtype == torch.float32))
    h, kv, d, t = 28, 4, 128, 9  # Qwen2.5-7B's heads
    qkv = torch.randn(t, (h + 2 * kv) * d, generator=g, device="cuda").to(dtype)
    inv_freq = 1.0 / 1e6 ** (torch.arange(0, d, 2, dtype=torch.float32, device="cuda") / d)
    cos, sin = rope_tables(torch.arange(first, first + t, device="cuda"), inv_freq, 1.0, dtype)
    cache_k, cache_v = torch.randn(2, kv, 1024, d, generator=g, device="cuda").to(dtype)
    ref_k, ref_v, step_k, step_v = cache_k.clone(), cache_v.clone(), cache_k.clone(), cache_v.clone()
    out = gpu_layer_ops.attention(qkv, cos, sin, cache_k, cache_v, first, None, h).reshape(t, h, d)
    q = decoders_rope_cache(qkv, cos, sin, ref_k, ref_v, first, h, kv, ())
    assert torch.equal(cache_k, ref_k) and torch.equal(cache_v, ref_v)
    end = first + t
    seen = torch.arange(end, device="cuda")[None, :] <= torch.arange(first, end, device="cuda")[:, None]
    scores = torch.einsum("thd,hnd->htn", q.double(), ref_k[:, :end].double().repeat_interleave(h // kv, 0))
    weights = (scores / d ** 0.5).masked_fill(~seen[None], float("-inf")).softmax(-1)
    exact = torch.einsum("htn,hnd->thd", weights, ref_v[:, :end].double().repeat_interleave(h // kv, 0))
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4  # bf16 rounding; fp32 dots in ieee precision
    torch.testing.assert_close(out.double(), exact, rtol=tol, atol=tol)
    alone = torch.cat([gpu_layer_ops.attention(qkv[i:i + 1], cos[i:i + 1], sin[i:i + 1], step_k, step_v, first + i,
                                               None, h).reshape(1, h, d) for i in range(t)])
    assert torch.equal(alone, out) and torch.equal(step_k, cache_k) and torch.equal(step_v, cache_v)
    wide = torch.cat([seen, torch.zeros(t, 1024 - end, dtype=torch.bool, device="cuda")], dim=1)
    slots = torch.arange(first, end, device="cuda")
    assert torch.equal(gpu_layer_ops.attention(qkv, cos, sin, cache_k, cache_v, slots, wide, h).reshape(t, h, d), out)


# Every method with the draft trained for it on the embedded pair (models.toml), so drafts are
# accepted often, partly and not at all, and the equality below proves something.
METHODS = ["naive", "vanilla", "deterministic", "suffix", "eagle3", "mtp", "hybrid", "medusa", "pard", "dflash"]


def heldout_prompts(n: int = 4) -> list[str]:
    path = Path(speclite.__file__).parent / "assets" / "heldout_prompts.jsonl"
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines()[:n]]


@pytest.fixture(scope="module")
def plain_cuda():
    """Plain decoding's tokens per (dtype, static): dynamic steps and CUDA-graph steps."""
    outputs = {}
    for dtype in ("float32", "bfloat16"):
        for static in (False, True):
            llm = LLM("tiny-code", device="cuda", dtype=dtype, static=static)
            outputs[dtype, static] = {p: llm.generate(p, GREEDY)[0].token_ids for p in heldout_prompts()}
    return outputs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graph_steps_give_the_dynamic_steps_tokens(plain_cuda, dtype):
    assert plain_cuda[dtype, True] == plain_cuda[dtype, False]


# bfloat16: the dense layers' GEMMs (cuBLAS) must give a row the same sums at 1 and k + 1 rows.
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("method", METHODS)
def test_greedy_speculation_equals_plain_on_cuda(plain_cuda, method, k, static, dtype):
    llm = LLM("tiny-code", {"method": method, "num_speculative_tokens": k}, device="cuda", dtype=dtype,
              static=static)
    outs = [llm.generate(prompt, GREEDY)[0] for prompt in heldout_prompts()]
    for prompt, out in zip(heldout_prompts(), outs):
        assert out.token_ids == plain_cuda[dtype, static][prompt], (method, k, static, dtype, prompt)
    if method != "naive":
        assert sum(o.aux_info["accept_rate"] for o in outs) > 0, method


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("scheme", ["int4", "w8a8", "fp8-block"])
def test_quantized_target_and_draft_are_exact_on_cuda(scheme, static):
    """A quantized target's speculative output equals its own plain decoding (the verify pass runs
    the same kernels on k + 1 rows), with the draft quantized too."""
    if scheme == "fp8-block" and not dispatch.fp8_dot_supported(torch.empty(0, device="cuda")):
        pytest.skip("fp8 tl.dot needs compute capability 8.9")
    plain = LLM("tiny-code", device="cuda", dtype="bfloat16", quant=scheme, static=static)
    for method in ("vanilla", "eagle3"):
        spec = LLM("tiny-code", {"method": method, "num_speculative_tokens": 4, "quantization": scheme},
                   device="cuda", dtype="bfloat16", quant=scheme, static=static)
        for prompt in heldout_prompts():
            assert spec.generate(prompt, GREEDY)[0].token_ids == plain.generate(prompt, GREEDY)[0].token_ids, \
                (method, prompt)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("scheme", ["nf4", "int8"])
def test_bitsandbytes_targets_are_exact_on_cuda(scheme, static, tmp_path):
    """bitsandbytes on CUDA in the loop: load-time nf4, and an LLM.int8 checkpoint written by
    transformers; each verification row runs alone (speclite.quant.bnb.rows_alone), so draft-model
    speculation gives plain decoding's tokens."""
    pytest.importorskip("bitsandbytes")
    model, quant = "tiny-code", scheme
    if scheme == "int8":
        import shutil

        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        from speclite.hub import resolve

        source = resolve("tiny-code")
        model, quant = str(tmp_path / "int8"), None
        AutoModelForCausalLM.from_pretrained(str(source), quantization_config=BitsAndBytesConfig(load_in_8bit=True),
                                             device_map="cuda").save_pretrained(model)
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
            shutil.copy(source / name, tmp_path / "int8" / name)
    plain = LLM(model, device="cuda", dtype="bfloat16", quant=quant, static=static)
    spec = LLM(model, {"method": "vanilla", "num_speculative_tokens": 4, "model": "tiny-code-draft"}, device="cuda",
               dtype="bfloat16", quant=quant, static=static)
    for prompt in heldout_prompts():
        assert spec.generate(prompt, GREEDY)[0].token_ids == plain.generate(prompt, GREEDY)[0].token_ids, prompt
