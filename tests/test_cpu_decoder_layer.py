"""Every decoder layer of a model in one C call (cpu_layer_ops.decoder_layers), or one layer per call
(Block.cpu_layer), gives the numbers of the same layers run module by module (norms, joined
projections, attention, residuals), bit for bit: logits, KV cache and the hidden states a drafter
asks for, in a prefill, a decode step and a token tree under its mask, dense and quantized, with and
without q/k/v biases."""

from __future__ import annotations

import pytest
import torch
from conftest import torch_threads

from speclite.kernels import cpu_gemm, cpu_layer_ops
from speclite.model.loader import load_model
from speclite.model.step import Tree, Wants
from speclite.quant.quantize import quantize_model
from speclite.sampling import SamplingParams

needs_kernels = pytest.mark.skipif(not cpu_layer_ops.available(), reason="no AVX2 CPU or no C++ compiler here")


def run_steps(model):
    """Logits, hidden states (every layer's input, the last one's output) and cache of a prefill, a
    decode step and a tree verification."""
    g = torch.Generator().manual_seed(5)
    vocab, wants = model.args.vocab_size, Wants(final=True, layers=tuple(range(model.args.num_layers + 1)))
    cache = model.new_cache(32)
    steps = [model.step(torch.randint(0, vocab, (7,), generator=g), cache, wants=wants)]
    steps.append(model.step(torch.randint(0, vocab, (1,), generator=g), cache, wants=wants))
    tree = Tree.of([-1, 0, 0, 1], "cpu")
    steps.append(model.step(torch.randint(0, vocab, (5,), generator=g), cache, tree=tree, wants=wants))
    # As plain decoding asks: the last row's logits of a prefill, then a step's; no states.
    steps.append(model.step(torch.randint(0, vocab, (4,), generator=g), cache, 1))
    steps.append(model.step(torch.randint(0, vocab, (1,), generator=g), cache))
    states = [t for s in steps for t in (s.logits, s.final, *s.layers.values()) if t is not None]
    return states + [t[:, :, :cache.length].clone() for layer in cache.layers for t in layer]


@needs_kernels
@pytest.mark.parametrize("quant", [None, "int4", "w8a8", "fp8-block"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen3"])
def test_fused_layer_equals_the_modules_bit_for_bit(isa, model_dirs, family, dtype, quant):
    model = load_model(model_dirs[family], device="cpu", dtype=dtype)
    if quant:
        model = quantize_model(model, quant, group_size=32)
    block = model.model.layers[0]
    x = torch.randn(1, model.args.hidden_size).to(dtype)
    with torch.inference_mode():
        whole = run_steps(model)
        fused = model.cpu_layers(x, model.new_cache(4))
        assert isinstance(fused, cpu_layer_ops.Layers)
        # The final norm and the head run in the same call wherever the kernels take the head.
        assert (fused.head is not None) == (cpu_gemm.module_matrices(x, [model.lm_head]) is not None)
        # A hook on one linear keeps the model off the one-call path and that block on its modules;
        # the other blocks run one call each. Hooks on every block: all on their modules.
        hooks = [block.self_attn.o_proj.register_forward_hook(lambda *_: None)]
        assert model.cpu_layers(x, model.new_cache(4)) is None and block.cpu_layer(x, model.new_cache(4).layers[0]) is None
        assert isinstance(model.model.layers[1].cpu_layer(x, model.new_cache(4).layers[1]), cpu_layer_ops.Layers)
        per_layer = run_steps(model)
        hooks += [b.self_attn.o_proj.register_forward_hook(lambda *_: None) for b in model.model.layers[1:]]
        modules = run_steps(model)
        for h in hooks:
            h.remove()
        assert isinstance(model.cpu_layers(x, model.new_cache(4)), cpu_layer_ops.Layers)
        # A hook on a block, on a container inside it, on the final norm or on the head fires too
        # (the model leaves the one call).
        seen = []
        watched = (model.model.layers[1], model.model.layers[1].mlp, model.model.norm, model.lm_head)
        for module in watched:
            hook = module.register_forward_pre_hook(lambda m, args: seen.append(m))
            run_steps(model)
            hook.remove()
        assert [seen.count(m) for m in watched] == [5] * len(watched)
        if model.args.qk_norm:  # Qwen3's q/k norms run inside the attention call, unless hooked
            q_norm = model.model.layers[0].self_attn.q_norm
            hook = q_norm.register_forward_pre_hook(lambda m, args: seen.append(m))
            assert model.cpu_layers(x, model.new_cache(4)) is None
            run_steps(model)
            hook.remove()
            assert seen.count(q_norm) == 5
    assert len(whole) == len(modules) == len(per_layer)
    for a, b, c in zip(whole, per_layer, modules):
        assert torch.equal(a, c) and torch.equal(b, c)
    assert all(torch.isfinite(t).all() for t in whole)


@needs_kernels
@pytest.mark.parametrize("quant", [None, "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cut", [False, True])
def test_greedy_chain_equals_greedy_steps_one_by_one(isa, model_dirs, dtype, quant, cut):
    # A draft model's greedy chain in one call: the tokens and the cache of steps fed one at a time
    # with the argmax of the first `vocab` logits (a draft vocabulary larger than the target's).
    model = load_model(model_dirs["qwen2"], device="cpu", dtype=dtype)
    g = torch.Generator().manual_seed(9)
    # A head of its own (the tiny model ties it to the embedding, and then repeats its input token).
    head = torch.randn(model.lm_head.weight.shape, generator=g).to(dtype)
    model.lm_head.weight = torch.nn.Parameter(head, requires_grad=False)
    if quant:
        model = quantize_model(model, quant, group_size=32)
    vocab = model.args.vocab_size // 2 if cut else model.args.vocab_size
    prompt = torch.randint(0, vocab, (6,), generator=g)
    caches = [model.new_cache(24), model.new_cache(24)]
    with torch.inference_mode():
        for cache in caches:
            model.step(prompt, cache, 1)
        token, expected = int(prompt[-1]) // 2, []
        for _ in range(9):
            logits = model.step(torch.tensor([expected[-1] if expected else token]), caches[0]).logits[-1]
            expected.append(int(torch.argmax(logits[:vocab])))
        chain = model.greedy_chain(token, caches[1], 9, vocab)
    assert chain == expected and len(set(chain)) > 1
    assert caches[0].length == caches[1].length == 15
    for (k0, v0), (k1, v1) in zip(caches[0].layers, caches[1].layers):
        assert torch.equal(k0[:, :15], k1[:, :15]) and torch.equal(v0[:, :15], v1[:, :15])


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_plain_chain_keeps_the_states_of_the_steps_one_by_one(isa, model_dirs, dtype, temperature):
    # Plain decoding's chunk under a proposer that drafts from the target's states (auto's k = 0):
    # every fed row's layer inputs, last layer output and final normed state, as single steps feeding
    # the same tokens give them; greedy, the tokens are those steps' argmax.
    model = load_model(model_dirs["qwen2"], device="cpu", dtype=dtype)
    g = torch.Generator().manual_seed(11)
    head = torch.randn(model.lm_head.weight.shape, generator=g).to(dtype)  # not tied: no echo of the input
    model.lm_head.weight = torch.nn.Parameter(head, requires_grad=False)
    vocab, n = model.args.vocab_size, model.args.num_layers
    wants = Wants(final=True, layers=tuple(range(n + 1)))
    params = SamplingParams(temperature=temperature, max_new_tokens=9)
    prompt = torch.randint(0, vocab, (6,), generator=g)
    caches = [model.new_cache(24), model.new_cache(24)]
    with torch.inference_mode():
        for cache in caches:
            model.step(prompt, cache, 1)
        token = int(prompt[-1])
        tokens, states = model.chain(token, caches[1], 9, vocab, params, torch.Generator().manual_seed(3), wants)
        steps = [model.step(torch.tensor([t]), caches[0], wants=wants) for t in [token] + tokens[:-1]]
    assert len(set(tokens)) > 1 and caches[0].length == caches[1].length == 15
    if temperature == 0:
        assert tokens == [int(torch.argmax(s.logits[-1])) for s in steps]
    assert torch.equal(states.final, torch.cat([s.final for s in steps]))
    assert sorted(states.layers) == list(range(n + 1))
    for i in range(n + 1):
        assert torch.equal(states.layers[i], torch.cat([s.layers[i] for s in steps])), i


@needs_kernels
def test_greedy_chain_declines_where_the_steps_must_run_one_by_one(isa, model_dirs):
    model = load_model(model_dirs["qwen2"], device="cpu")
    cache = model.new_cache(8)
    with torch.inference_mode():
        model.step(torch.tensor([3, 4]), cache, 1)
        assert model.greedy_chain(5, cache, 7, model.args.vocab_size) is None  # past the cache's end
        hook = model.model.embed_tokens.register_forward_hook(lambda *_: None)
        assert model.greedy_chain(5, cache, 2, model.args.vocab_size) is None  # the embedding's hook must fire
        hook.remove()
        assert len(model.greedy_chain(5, cache, 2, model.args.vocab_size)) == 2
    assert cache.length == 4


@needs_kernels
@pytest.mark.parametrize("quant", [None, "int4", "w8a8"])
def test_a_team_of_two_threads_gives_one_threads_numbers(isa, model_dirs, quant):
    # Every product of a whole step ends in the team's own barrier (team.h, TeamBarrier) and the next
    # reads what both threads wrote: a barrier that let a thread through early would read a stale
    # row. Logits, states and caches of every step kind, two threads against one, bit for bit.
    model = load_model(model_dirs["qwen3"], device="cpu", dtype=torch.bfloat16)
    if quant:
        model = quantize_model(model, quant, group_size=32)
    runs = []
    for n in (2, 1, 2):
        with torch_threads(n), torch.inference_mode():
            runs.append(run_steps(model))
    for run in runs[1:]:
        assert len(run) == len(runs[0]) and all(torch.equal(a, b) for a, b in zip(run, runs[0]))
