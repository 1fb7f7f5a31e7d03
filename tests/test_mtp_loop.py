"""MTP through the real loop: greedy output equals plain decoding (DeepSeek-V3 module in the
checkpoint, MiMo target, separate checkpoint; float32 and int4), sampled output follows the
target's exact warped distributions, and `speclite generate --sp-type mtp` end to end."""

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from conftest import SAMPLED_WARPS, cli_generate, decode_all, runs_match, save_model
from mtp_modules import add_module, save_separate
from speclite.engine.loop import Speculation
from speclite.model import load_model
from speclite.quant import quantize_model
from speclite.sampling import SamplingParams
from speclite.speculate.mtp import MTPProposer, load_draft
from speclite.speculate.schedule import SpecLength
from test_sampling_exact import (SETTINGS, VOCAB, chi_square_pvalue, exact_distributions, one_thread, sampled_counts,
                                 save_small_target)

GREEDY = SamplingParams(max_new_tokens=16, ignore_eos=True)
TINY_VOCAB = 24  # small enough that a random module's drafts are sometimes right
rng = random.Random(5)
PROMPTS = [[rng.randrange(TINY_VOCAB) for _ in range(rng.randrange(3, 12))] for _ in range(5)]


def generate(target, prompt, spec=None, params=GREEDY):
    return decode_all(target, prompt, params, spec)


def proposer(target, module_dir=None, quant=None, max_len=64, **tree):
    return MTPProposer(load_draft(module_dir, target, quant), target.model.embed_tokens, max_len,
                       target.args.vocab_size, **tree)


def save_tiny(path, config_cls, seed):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config_cls(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False))
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    model.save_pretrained(path)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp-loop")
    save_tiny(root / "deepseek", LlamaConfig, seed=5)
    add_module(root / "deepseek", "deepseek", seed=3)
    save_tiny(root / "mimo", Qwen2Config, seed=6)
    add_module(root / "mimo", "mimo", seed=4)
    save_separate(root / "separate", root / "deepseek", "deepseek", seed=9)
    save_separate(root / "separate-mimo", root / "deepseek", "mimo", seed=8, own_head=False)
    return root


@pytest.mark.parametrize("target_name, module", [("deepseek", None), ("mimo", None), ("deepseek", "separate"),
                                                  ("deepseek", "separate-mimo")])
def test_greedy_identical_to_plain(dirs, target_name, module):
    target = load_model(dirs / target_name, "cpu", torch.float32)
    plain = [generate(target, p)[0] for p in PROMPTS]
    accepted = 0
    for k in (1, 2, 3, 5):
        spec = Speculation(proposer(target, module and dirs / module), SpecLength(k))
        for i, prompt in enumerate(PROMPTS):
            out, stats = generate(target, prompt, spec)
            assert out == plain[i], (target_name, module, k, i)
            accepted += stats.accepted
    assert accepted > 0  # drafts were verified and some stood


def test_int4_target_with_quantized_modules(dirs):
    target = quantize_model(load_model(dirs / "deepseek", "cpu", torch.float32), "int4", group_size=32)
    for module, quant in ((None, None), ("separate", "int4"), (None, "int4")):
        spec = Speculation(proposer(target, module and dirs / module, quant), SpecLength(3))
        for prompt in PROMPTS[:3]:
            assert generate(target, prompt, spec)[0] == generate(target, prompt)[0], (module, quant)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """test_sampling_exact's small-vocabulary target with a DeepSeek-V3 module."""
    root = tmp_path_factory.mktemp("mtp-small")
    save_small_target(root)
    add_module(root, "deepseek", seed=5, scale=3.0)
    with one_thread():
        yield load_model(root, device="cpu")


@pytest.mark.parametrize("name", ["temperature 1", "top-k 3, temperature 0.8"])
def test_sampling_matches_target_distribution(small, name):
    params = SETTINGS[name]
    pairs, thirds, accepted, proposed = sampled_counts(small, proposer(small, max_len=16), params)
    assert 0.05 < accepted / proposed < 0.9, accepted / proposed
    joint, third = exact_distributions(small, params)
    assert chi_square_pvalue(pairs, joint) > 1e-4
    assert chi_square_pvalue(thirds, third) > 1e-4


def test_cli_generate_with_mtp_equals_plain(tmp_path):
    """`speclite generate --sp-type mtp`: the module from the target's checkpoint (drafting a tree:
    the EAGLE-3 tree flags reach it), and from --draft (a chain)."""
    target_dir = tmp_path / "target"
    save_model(target_dir, "llama", seed=5, hidden=64, layers=4, intermediate_size=128)
    add_module(target_dir, "deepseek", seed=3)
    save_separate(tmp_path / "module", target_dir, "deepseek", seed=7)

    plain = {i: r["token_ids"] for i, r in cli_generate(target_dir, tmp_path, "plain.jsonl").items()}
    separate = ("--draft", str(tmp_path / "module"), "--draft-quant", "int4")
    tree = ("--gen-num-per-cycle", "4", "--eagle-topk", "2", "--eagle-steps", "3", "--eagle-num-draft-tokens", "5")
    for out, flags in (("own.jsonl", tree), ("draft.jsonl", ("--gen-num-per-cycle", "3", *separate))):
        mtp = cli_generate(target_dir, tmp_path, out, "--sp-type", "mtp", *flags)
        assert {i: r["token_ids"] for i, r in mtp.items()} == plain, flags
        assert all(r["aux_info"]["accepted_per_position"] for r in mtp.values())  # drafts were verified


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("target_name, module", [("deepseek", None), ("mimo", None), ("deepseek", "separate-mimo")])
def test_module_steps_in_one_call_draft_what_its_steps_one_by_one_do(dirs, monkeypatch, dtype, target_name, module):
    """On the CPU an MTP module's rows and greedy chains run in one C call each (eh_proj over the
    normed pair, the block, the norm and the head; MiMo's normed state and [state, embedding] order;
    the target's lm_head where the module has none): through the loop its proposals equal, bit for
    bit, those of the same module run step by step (kept so by a hook on its block)."""
    from speclite.kernels import cpu_layer_ops

    target = load_model(dirs / target_name, "cpu", dtype)
    chains = []
    real = cpu_layer_ops.head_chain
    monkeypatch.setattr(cpu_layer_ops, "head_chain", lambda *a, **k: chains.append(1) or real(*a, **k))
    monkeypatch.setattr(MTPProposer, "greedy_run", lambda *a: None)  # proposals one iteration at a time
    runs = []
    for stepwise in (False, True):
        prop = proposer(target, dirs / module if module else None)
        if stepwise:
            prop.head.model.layers[0].mlp.register_forward_hook(lambda *_: None)
        proposals = []
        propose = prop.propose
        prop.propose = lambda k, propose=propose: proposals.append(propose(k)) or proposals[-1]
        spec = Speculation(prop, SpecLength(4))
        outs = [generate(target, p, spec)[0] for p in PROMPTS]
        runs.append((outs, [q.tokens for q in proposals]))
        if not stepwise:
            assert chains, "the chain ran in one call"
            chains.clear()
    assert runs[0] == runs[1] and not chains


@pytest.mark.parametrize("target_name, module", [("deepseek", None), ("mimo", None), ("deepseek", "separate-mimo")])
def test_greedy_runs_in_one_call_equal_the_iterations_one_by_one(isa, dirs, target_name, module, monkeypatch):
    """Greedy decoding on the CPU kernels runs the module's chain, the target's pass, the acceptance and
    the final normed states in one C call for many iterations (greedy_run; MiMo's normed state and
    [state, embedding] order, the target's lm_head where the module has none): the same tokens and
    iterations, the target's cache, the module's committed cache rows and pending states as the
    loop's iterations one by one, also with an EOS and with the room ending a call; and sampled
    (sampled_run: the chain drawn and judged by rejection sampling in the same call)."""
    from test_eagle3_loop import run_loop

    target = load_model(dirs / target_name, "cpu", torch.float32)
    for k in (1, 3, 4, 8):
        spec = Speculation(proposer(target, dirs / module if module else None, max_len=96), SpecLength(k))
        for prompt in PROMPTS[:3]:
            runs_match(lambda eos, room: run_loop(target, spec, prompt, eos, room), MTPProposer, "head_iterations",
                              monkeypatch, 48, (k, prompt))
    for i, k in enumerate((1, 4)):  # sampled: the chain drawn and judged by rejection sampling in the same call
        spec = Speculation(proposer(target, dirs / module if module else None, max_len=96), SpecLength(k))
        runs_match(lambda eos, room: run_loop(target, spec, PROMPTS[i], eos, room, SAMPLED_WARPS[i]), MTPProposer,
                   "head_iterations", monkeypatch, 40, (k, "sampled"), sampled=True)
