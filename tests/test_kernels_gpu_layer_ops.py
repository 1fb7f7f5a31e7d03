"""The GPU layer ops' Triton kernels (RMSNorm, SiLU-and-multiply, q/k norms + RoPE + cache write)
under Triton's interpreter, against the decoder's own torch code and float64 math: the same
numbers, each row independent of the rows beside it, and nothing in the cache but the new slots
touched; and the decoder routed through them (with the attention kernel, tests/test_kernels_attention.py):
its torch code's logits and states, and greedy speculation equal to plain decoding. tests/test_cuda.py
runs them compiled on a GPU.

The interpreter truncates float32 to bfloat16 where a GPU rounds to nearest, so bfloat16 is held
to a few of its steps here; float16 and float32 round as on a GPU and are held to the same bits
where the torch code does the same arithmetic."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (speclite.kernels imports it lazily)

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from layer_ops_reference import decoders_rope_cache, torch_rms_norm  # noqa: E402

from speclite.kernels import gpu_layer_ops_triton as ops  # noqa: E402
from speclite.model.decoder import rope_tables  # noqa: E402


def tolerance(dtype):
    return {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.float16: {"rtol": 2e-3, "atol": 1e-3},
            torch.bfloat16: {"rtol": 2e-2, "atol": 1e-1}}[dtype]  # up to four truncations of values ~2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,dim", [(1, 896), (5, 64), (3, 200)])
def test_rms_norm_is_the_decoders(dtype, rows, dim):
    gen = torch.Generator().manual_seed(rows * dim)
    x = (torch.randn(rows, dim, generator=gen) * 3).to(dtype)
    weight = (torch.rand(dim, generator=gen) + 0.5).to(dtype)
    y = ops.rms_norm(x, weight, 1e-6)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, torch_rms_norm(x, weight, 1e-6), **tolerance(dtype))
    exact = x.double() / x.double().pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * weight.double()
    torch.testing.assert_close(y.double(), exact, **tolerance(dtype))
    # A float32 weight on bf16 states: float32 out, as torch's product promotes.
    if dtype == torch.bfloat16:
        assert ops.rms_norm(x, weight.float(), 1e-6).dtype == torch.float32
    # Row by row, the same bits: a token's norm does not depend on the rows beside it.
    assert torch.equal(torch.cat([ops.rms_norm(x[i:i + 1], weight, 1e-6) for i in range(rows)]), y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_add_then_rms_norm_is_the_decoders(dtype):
    """A block's residual add and the norm after it in one kernel: the sum as torch's add gives it (the
    same bits but for the interpreter's bf16 truncation), the norm the norm of that sum."""
    gen = torch.Generator().manual_seed(5)
    x, delta = (torch.randn(2, 3, 200, generator=gen) * 3).to(dtype)
    weight = (torch.rand(200, generator=gen) + 0.5).to(dtype)
    total, y = ops.rms_norm(x, weight, 1e-6, delta)
    assert total.shape == x.shape and y.shape == x.shape and total.dtype == y.dtype == dtype
    if dtype == torch.bfloat16:
        torch.testing.assert_close(total, x + delta, **tolerance(dtype))
    else:
        assert torch.equal(total, x + delta)
    torch.testing.assert_close(y, torch_rms_norm(x + delta, weight, 1e-6), **tolerance(dtype))
    assert torch.equal(y, ops.rms_norm(total, weight, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_silu_mul_is_the_decoders(dtype):
    gen = torch.Generator().manual_seed(7)
    gate_up = (torch.randn(3, 2 * 1300, generator=gen) * 4).to(dtype)  # 1300: a partial last block
    y = ops.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(y, F.silu(gate) * up, **tolerance(dtype))
    g, u = gate.double(), up.double()
    torch.testing.assert_close(y.double(), g * torch.sigmoid(g) * u, **tolerance(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["rope", "qk-norm+rope"])
@pytest.mark.parametrize("static", [False, True], ids=["start", "slots"])
@pytest.mark.parametrize("dim", [64, 80])  # 80: a head narrower than its power-of-two block
def test_rope_cache_is_the_decoders(dtype, qk_norm, static, dim):
    h, kv, t, max_len, first = 4, 2, 3, 16, 9
    gen = torch.Generator().manual_seed(dim + 2 * qk_norm + static)
    qkv = torch.randn(t, (h + 2 * kv) * dim, generator=gen).to(dtype)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    cos, sin = rope_tables(torch.arange(first, first + t), inv_freq, 1.0, dtype)
    norms = (((torch.rand(dim, generator=gen) + 0.5).to(dtype), (torch.rand(dim, generator=gen) + 0.5).to(dtype)),
             1e-6) if qk_norm else ()
    start = torch.arange(first, first + t) if static else first
    cache_k, cache_v = torch.randn(2, kv, max_len, dim, generator=gen).to(dtype)  # old entries: never zeros
    ref_k, ref_v = cache_k.clone(), cache_v.clone()
    q = ops.rope_cache(qkv, cos, sin, cache_k, cache_v, start, h, kv, norms)
    q_ref = decoders_rope_cache(qkv, cos, sin, ref_k, ref_v, start, h, kv, norms)
    if qk_norm or dtype == torch.bfloat16:  # the norm's sum may round differently; bf16: see above
        torch.testing.assert_close(q, q_ref, **tolerance(dtype))
        torch.testing.assert_close(cache_k, ref_k, **tolerance(dtype))
    else:  # each product rounded as torch rounds it: the same bits
        assert torch.equal(q, q_ref) and torch.equal(cache_k, ref_k)
    assert torch.equal(cache_v, ref_v)
    # Token by token into a fresh copy of the old cache: the same q and the same cache.
    step_k, step_v = torch.randn(2, kv, max_len, dim, generator=gen).to(dtype)
    step_k[:, :first], step_v[:, :first] = ref_k[:, :first], ref_v[:, :first]
    step_k[:, first + t:], step_v[:, first + t:] = ref_k[:, first + t:], ref_v[:, first + t:]
    rows = [ops.rope_cache(qkv[i:i + 1], cos[i:i + 1], sin[i:i + 1], step_k, step_v,
                           start[i:i + 1] if static else first + i, h, kv, norms) for i in range(t)]
    assert torch.equal(torch.cat(rows), q) and torch.equal(step_k, cache_k) and torch.equal(step_v, cache_v)


def test_rope_is_float64_rotation():
    """Independent of the decoder's code: q and k turned by each position's angles, in float64."""
    h, kv, t, dim, first = 2, 1, 4, 64, 5
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(t, (h + 2 * kv) * dim, generator=gen)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    cos, sin = rope_tables(torch.arange(first, first + t), inv_freq, 1.0, torch.float32)
    cache_k, cache_v = torch.randn(2, kv, 12, dim, generator=gen)
    q = ops.rope_cache(qkv, cos, sin, cache_k, cache_v, first, h, kv, ())
    angle = torch.arange(first, first + t, dtype=torch.float64)[:, None] * inv_freq.double()[None, :]  # [t, D/2]
    x = qkv[:, :h * dim].double().reshape(t, h, 2, dim // 2)  # halves: (x1, x2) turn as a complex x1 + i x2
    c, s = angle.cos()[:, None], angle.sin()[:, None]
    turned = torch.stack([x[:, :, 0] * c - x[:, :, 1] * s, x[:, :, 1] * c + x[:, :, 0] * s], dim=2).reshape(t, h, dim)
    torch.testing.assert_close(q.double(), turned, rtol=1e-5, atol=1e-5)


def small_model(config):
    from speclite.synthetic import narrow_transformer

    model = narrow_transformer(config, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=16, vocab_size=300, num_hidden_layers=2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)  # norms that do something
    return model


@pytest.fixture
def as_on_a_gpu(monkeypatch):
    """The decoder's choices as on a GPU, on CPU tensors: the C kernels off; gpu(True) routes the
    layer ops to these kernels (interpreted), gpu(False) to the decoder's torch code."""
    from speclite.kernels import cpu_gemm, cpu_layer_ops, gpu_layer_ops

    monkeypatch.setattr(cpu_layer_ops, "takes", lambda x: False)
    monkeypatch.setattr(cpu_gemm, "takes", lambda x: False)
    return lambda on: monkeypatch.setattr(gpu_layer_ops, "takes", lambda x: on)


def two_steps(model):
    """Logits of a dynamic 5-token prefill and a fixed-shape 2-token step after it."""
    tokens = torch.randint(0, 300, (7,), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(16)
    with torch.inference_mode():
        prefill = model.step(tokens[:5], cache).logits
        slots = torch.arange(5, 7)
        fixed = model.forward_static(tokens[5:], slots, slots, torch.ones(2, 2, dtype=torch.bool).tril(), cache).logits
    return prefill, fixed


@pytest.mark.parametrize("config", ["qwen2.5-0.5b", "qwen3-0.6b"])  # q/k/v biases; q/k norms
def test_decoder_through_the_gpu_ops_gives_its_torch_codes_logits(config, as_on_a_gpu):
    model = small_model(config)
    as_on_a_gpu(True)
    ours = two_steps(model)
    as_on_a_gpu(False)
    for mine, theirs in zip(ours, two_steps(model)):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def storage_bytes(tensors) -> dict:
    """Each distinct storage under the tensors: its address -> its size."""
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def test_joined_projections_are_views_and_give_the_same_logits(as_on_a_gpu):
    """join_projections: q/k/v and gate/up as rows of one tensor each, the parameters its views (the
    state dict the same numbers, no byte added), and the same logits."""
    from speclite.model.decoder import join_projections

    model = small_model("qwen2.5-0.5b")
    as_on_a_gpu(True)
    before = two_steps(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    storages = storage_bytes(model.parameters())
    join_projections(model)
    after = storage_bytes(model.parameters())
    # Per block q, k, v (weights and biases), gate and up: eight tensors become three.
    assert sum(after.values()) == sum(storages.values()) and len(storages) - len(after) == 5 * 2
    for block in model.model.layers:
        attn, mlp = block.self_attn, block.mlp
        for group in ([attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj]):
            weight = group[0].joined[0].weight
            assert all(m.weight.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr() for m in group)
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    for mine, theirs in zip(two_steps(model), before):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    # A weight replaced after the join (a quantizer, say) is what the layer then uses.
    attn = model.model.layers[0].self_attn
    attn.k_proj.weight = torch.nn.Parameter(attn.k_proj.weight * 2, requires_grad=False)
    x = torch.randn(3, 64)
    with torch.inference_mode():
        from speclite.model.decoder import project
        qkv = project(x, attn.q_proj, attn.k_proj, attn.v_proj)
    torch.testing.assert_close(qkv[:, 64:96], x @ attn.k_proj.weight.T + attn.k_proj.bias)


def quantized(model, scheme, fp8_block=(16, 16)):
    """Every block's linears as the quantized modules a GPU runs (kernels=True: their torch paths on
    these CPU tensors)."""
    from speclite.quant.fp8 import quantize_fp8_blocks
    from speclite.quant.int4 import quantize_rtn
    from speclite.quant.int8 import quantize_int8_channel
    from speclite.quant.linear import Fp8Linear, Int4Linear, Int8Linear

    for block in model.model.layers:
        for parent in (block.self_attn, block.mlp):
            for name, linear in list(parent.named_children()):
                if not isinstance(linear, torch.nn.Linear):
                    continue
                w, b = linear.weight.detach(), None if linear.bias is None else linear.bias.detach()
                if scheme.startswith("int4"):
                    q4 = quantize_rtn(w, 32, False)
                    if scheme == "int4-act-order":  # one shuffle of the groups per input width, as GPTQ's desc_act
                        perm = torch.randperm(w.shape[1], generator=torch.Generator().manual_seed(w.shape[1]))
                        q4.q, q4.g_idx = q4.q[:, perm], q4.g_idx[perm]
                    new = Int4Linear(q4, b, torch.float32, "cpu", kernels=True)
                elif scheme == "fp8-block":
                    new = Fp8Linear(*quantize_fp8_blocks(w, fp8_block), fp8_block, b, torch.float32, "cpu", kernels=True)
                else:
                    new = Int8Linear(*quantize_int8_channel(w), b, torch.float32, "cpu", kernels=True)
                setattr(parent, name, new)
    return model


@pytest.mark.parametrize("scheme", ["int4", "int4-act-order", "fp8-block", "w8a8"])
def test_joined_quantized_projections_are_views_and_give_the_same_logits(scheme, as_on_a_gpu):
    """Quantized q/k/v and gate/up joined too: W4A16's packed weights, zeros and scales as columns,
    FP8 blocks and W8A8 rows with their scales as rows; each module's tensors views of the joint ones
    (no byte added, the state dict the same numbers) and the same logits."""
    from speclite.model.decoder import join_projections

    model = quantized(small_model("qwen2.5-0.5b"), scheme)
    as_on_a_gpu(True)
    before = two_steps(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    nbytes = sum(storage_bytes(model.state_dict().values()).values())
    join_projections(model)
    assert sum(storage_bytes(model.state_dict().values()).values()) == nbytes
    for block in model.model.layers:
        attn, mlp = block.self_attn, block.mlp
        for group in ([attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj]):
            joint = group[0].joined[0]
            assert type(joint) is type(group[0]) and joint.out_features == sum(m.out_features for m in group)
            for name, tensor in joint.named_buffers():
                if name != "perm":
                    assert all(getattr(m, name).untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
                               for m in group)
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    for mine, theirs in zip(two_steps(model), before):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def test_fp8_parts_of_partial_blocks_stay_apart(as_on_a_gpu):
    """FP8 parts whose rows end inside a scale block (k and v 32 rows wide, blocks of 128) cannot share
    the joint scale rows: they keep their own kernels."""
    from speclite.model.decoder import join_projections

    model = quantized(small_model("qwen2.5-0.5b"), "fp8-block", fp8_block=(128, 128))
    as_on_a_gpu(True)
    join_projections(model)
    assert not any(hasattr(m, "joined") for m in model.modules())


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("t,first,span", [(1, 9, 256), (5, 0, 16), (4, 300, 1536)])  # a step, a tree at 0, past a block
def test_static_mask_is_forward_statics(window, t, first, span):
    """A CUDA-graph step's mask in one kernel: every cache key before the first new slot, the new tokens
    by their tree mask (ancestors only), nothing after them, a sliding window bounding both."""
    gen = torch.Generator().manual_seed(t + first)
    slots = torch.arange(first, first + t)
    pos = slots - 2  # a tree's positions are its depths, not its slots
    tree = torch.rand(t, t, generator=gen) < 0.5
    tree |= torch.eye(t, dtype=torch.bool)
    mask = ops.static_mask(slots, pos, tree, span, window)
    rel = torch.arange(span) - first  # the rule, independently: key j is new token j - first
    new = (rel >= 0) & (rel < t)
    expected = (rel < 0)[None, :] | (tree[:, rel.clamp(0, t - 1)] & new[None, :])
    if window is not None:
        key_pos = torch.where(new, pos[rel.clamp(0, t - 1)], rel + first)
        expected &= key_pos[None, :] > pos[:, None] - window
    assert mask.dtype == torch.bool and torch.equal(mask, expected)


@pytest.mark.parametrize("wanted", [(), (1,), (0, 2)], ids=["none", "middle", "first+last"])
def test_blocks_leave_their_residual_add_to_the_next_norm(wanted, as_on_a_gpu):
    """A step's blocks hand their MLP output to the next norm's kernel unadded (RMSNorm.after_add):
    the logits, final states and wanted layer states are the bits of the blocks called one by one, each
    adding its own; a block with a hook is called (the hook fires) with the stream summed."""
    from speclite.model.decoder import rope_tables
    from speclite.model.step import Wants

    model = small_model("qwen3-0.6b")
    as_on_a_gpu(True)
    tokens = torch.randint(0, 300, (6,), generator=torch.Generator().manual_seed(4))
    wants = Wants(final=True, layers=wanted)
    with torch.inference_mode():
        step = model.step(tokens, model.new_cache(16), wants=wants)
        cache = model.new_cache(16)
        x = model.embed(tokens)
        cos, sin = rope_tables(torch.arange(6), model.inv_freq, model.rope_scale, x.dtype)
        states = {}
        for i, (block, layer_cache) in enumerate(zip(model.model.layers, cache.layers)):
            states[i] = x
            x = block(x, cos, sin, layer_cache, 0, None)
        states[2] = x
        final = model.model.norm(x)
        assert torch.equal(step.final, final) and torch.equal(step.logits, model.lm_head(final))
        assert step.layers.keys() == set(wanted) and all(torch.equal(step.layers[i], states[i]) for i in wanted)
        seen = []
        model.model.layers[1].register_forward_hook(lambda module, args, out: seen.append(args[0].clone()))
        hooked = model.step(tokens, model.new_cache(16), wants=wants)
    assert len(seen) == 1 and torch.equal(seen[0], states[1]) and torch.equal(hooked.logits, step.logits)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "cuda-graph-steps"])
def test_greedy_speculation_through_the_gpu_ops_equals_plain(pair, static, as_on_a_gpu):
    """The loop on the decoder's GPU routes (these kernels, interpreted): a draft model's chains verified
    in k + 1-row passes give plain decoding's tokens, every row's attention its one-row step's."""
    from speclite import LLM, SamplingParams

    as_on_a_gpu(True)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    plain = LLM(pair[0], static=static)
    spec = LLM(pair[0], {"method": "vanilla", "model": str(pair[1]), "num_speculative_tokens": 3}, static=static)
    for prompt in ("def add(a, b):", "the quick brown"):
        out = spec.generate(prompt, params)[0]
        assert out.token_ids == plain.generate(prompt, params)[0].token_ids
        assert 0 < out.aux_info["accept_rate"] < 1  # drafts accepted and rejected: the equality proves something


@pytest.mark.parametrize("scheme", ["fp8-block", "w8a8"])
def test_norms_and_silu_quantize_the_input_of_their_gemms(scheme, as_on_a_gpu, monkeypatch):
    """FP8-block and W8A8 layers take their input quantized by the kernel that made it (the norms,
    SiLU-and-multiply, and for FP8 groups inside a head the attention): the same logits, bit for bit, as
    quantizing it themselves; only W8A8's o_proj (a token's scale spans every head) quantizes its own."""
    from speclite.kernels import fp8_block, gpu_layer_ops, int8

    model = quantized(small_model("qwen2.5-0.5b"), scheme)
    as_on_a_gpu(True)
    module, name = ((fp8_block, "per_token_group_quant_fp8_torch") if scheme == "fp8-block"
                    else (int8, "per_token_quant_int8_torch"))
    real, calls = getattr(module, name), []
    monkeypatch.setattr(module, name, lambda *args: calls.append(1) or real(*args))
    fused = two_steps(model)
    assert len(calls) == (0 if scheme == "fp8-block" else 2 * 2)  # two forwards x two layers: W8A8's o_proj
    calls.clear()
    monkeypatch.setattr(gpu_layer_ops, "quantized", lambda x, quant: None)  # every GEMM quantizes its own
    unfused = two_steps(model)
    assert len(calls) == 2 * 2 * 7  # q, k, v, o, gate, up, down
    assert all(torch.equal(a, b) for a, b in zip(fused, unfused))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("quant", [("fp8", 128), ("fp8", 32), ("int8", None)], ids=["fp8-128", "fp8-32", "int8"])
@pytest.mark.parametrize("dim", [200, 2600])  # a partial group; several SiLU blocks (and int8's loop)
def test_producers_quantize_their_output_as_the_gemms_quantizer(dtype, quant, dim):
    """A norm's and SiLU-and-multiply's quantized rows are the GEMM's own quantizer's of their output, bit
    for bit (fp8 per token per group of columns, int8 per token), and the output is unchanged."""
    from speclite.kernels.fp8_block import per_token_group_quant_fp8_torch
    from speclite.kernels.int8 import per_token_quant_int8_torch

    def reference(y):
        return per_token_group_quant_fp8_torch(y, quant[1]) if quant[0] == "fp8" else per_token_quant_int8_torch(y)

    def same(made, expected):  # as values: a tiny negative becomes +0 here and -0 in torch's fp8 conversion
        return torch.equal(made[0].float(), expected[0].float()) and torch.equal(made[1], expected[1])

    gen = torch.Generator().manual_seed(dim)
    x, delta = (torch.randn(2, 3, dim, generator=gen) * 3).to(dtype)
    weight = (torch.rand(dim, generator=gen) + 0.5).to(dtype)
    y, q, scales = ops.rms_norm(x, weight, 1e-6, None, quant)
    assert torch.equal(y, ops.rms_norm(x, weight, 1e-6)) and same((q, scales), reference(y))
    total, y, q, scales = ops.rms_norm(x, weight, 1e-6, delta, quant)
    assert torch.equal(y, ops.rms_norm(x, weight, 1e-6, delta)[1]) and same((q, scales), reference(y))
    gate_up = (torch.randn(3, 2 * dim, generator=gen) * 3).to(dtype)
    y, q, scales = ops.silu_mul(gate_up, quant)
    assert torch.equal(y, ops.silu_mul(gate_up)) and same((q, scales), reference(y))
