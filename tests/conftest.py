"""Tiny models built offline with transformers: random weights from configs, saved with save_pretrained."""

from __future__ import annotations

import os
from contextlib import contextmanager

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may reach the hub

import pytest
import torch

from speclite.kernels import cpu_build

@contextmanager
def torch_threads(n: int):
    """torch (and the CPU kernels, which take torch's count) on n threads inside the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "the quick brown fox jumps over the lazy dog.",
    "import os\nimport sys\n\nclass Config:\n    name = 'speclite'\n",
    '{"id": 1, "name": "value", "items": [1, 2, 3]}',
]


def make_tokenizer(vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, chat_template=CHAT_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


CONFIGS = {
    "llama": dict(tie_word_embeddings=False),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(head_dim=24, tie_word_embeddings=False),
    "mistral": dict(tie_word_embeddings=False),
}


def save_model(path, family: str = "qwen2", seed: int = 0, hidden: int = 64, layers: int = 2, vocab_pad: int = 0,
               tokenizer=None, **overrides):
    """A random model of `family` with the test tokenizer, saved as an HF model directory."""
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    tokenizer = tokenizer or make_tokenizer()
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}[family]
    kwargs = dict(
        vocab_size=len(tokenizer) + vocab_pad, hidden_size=hidden, intermediate_size=2 * hidden + 32,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None, pad_token_id=tokenizer.pad_token_id,
    )
    kwargs.update(CONFIGS[family])
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cls(**kwargs))
    # Random init is near-uniform; a sharper head makes greedy paths and acceptance meaningful.
    # (Tied random models just echo their input token: tests of decoding use untied ones.)
    if not kwargs["tie_word_embeddings"]:
        with torch.no_grad():
            model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


def pytest_ignore_collect(collection_path, config):
    """`pytest -m cuda` collects the CUDA tests' modules alone: the CPU suite's kernel modules set
    TRITON_INTERPRET=1 when imported, which would run the CUDA tests' kernels in the interpreter."""
    if config.getoption("markexpr", "") == "cuda" and collection_path.suffix == ".py":
        return not collection_path.name.startswith("test_cuda") and collection_path.name.startswith("test_")
    return None


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer):
    """family -> directory of a saved tiny random model."""
    root = tmp_path_factory.mktemp("models")
    return {family: _saved(root / family, family, tokenizer) for family in CONFIGS}


def _saved(path, family, tokenizer, **kw):
    save_model(path, family, tokenizer=tokenizer, **kw)
    return path


def save_noisy_copy(src, dst, noise: float, seed: int, vocab_pad: int = 0):
    """A draft that agrees with the target often but not always: its weights plus noise, rounded to
    bf16 values as most checkpoints' (stored in float32: loaded as float32, narrowed to bf16 on the
    CPU, so a drafter's products take the AMX bf16 tiles where the CPU has them)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
            p.copy_(p.bfloat16())
    if vocab_pad:
        model.resize_token_embeddings(model.config.vocab_size + vocab_pad)
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)


@pytest.fixture(scope="session")
def pair(tmp_path_factory, tokenizer):
    """(target_dir, draft_dir): a Qwen2 target and a noisy copy of it as draft, vocab padded by 16."""
    root = tmp_path_factory.mktemp("pair")
    target = _saved(root / "target", "qwen2", tokenizer, seed=1, hidden=96, layers=3, tie_word_embeddings=False)
    save_noisy_copy(target, root / "draft", noise=0.1, seed=2, vocab_pad=16)
    return target, root / "draft"


@pytest.fixture(scope="session")
def stranger(tmp_path_factory, tokenizer):
    """A draft of the same tokenizer that disagrees with the pair's target almost always."""
    return _saved(tmp_path_factory.mktemp("stranger") / "m", "llama", tokenizer, seed=9, hidden=48, layers=1)


CLI_PROMPTS = ["def add(a, b):", "for i in range(10):", "import os"]


def cli_generate(model_dir, out_dir, name: str, *flags, max_new_tokens: int = 12) -> dict[int, list[int]]:
    """`speclite generate` on CLI_PROMPTS in a fresh process: {id: record} of `name`.jsonl in out_dir."""
    import json
    import subprocess
    import sys

    inp, out = out_dir / "cli-prompts.jsonl", out_dir / name
    inp.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(CLI_PROMPTS)))
    r = subprocess.run([sys.executable, "-m", "speclite.cli", "generate", "--model", str(model_dir), "-i", str(inp),
                        "-o", str(out), "--max-new-tokens", str(max_new_tokens), *flags],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines())}


def decode_all(target, prompt: list[int], params, spec=None, cache_len: int = 64, eos=frozenset(), cache=None):
    """The loop on one prompt in a fresh cache (or `cache`): (every token it produced, its stats)."""
    from speclite.engine.loop import Request, decode

    with torch.inference_mode():
        cache = target.new_cache(cache_len) if cache is None else cache
        run = decode(target, cache, Request(prompt, params, eos_ids=set(eos)), spec)
        return [t for chunk in run for t in chunk], run.stats


# Warps for the sampled runs' tests: temperature alone, top-k with top-p, top-p.
SAMPLED_WARPS = [dict(temperature=0.8), dict(temperature=1.0, top_k=20, top_p=0.9), dict(temperature=0.6, top_p=0.7)]
RUN_STATS = ("iter_count", "proposed", "accepted", "proposed_at", "accepted_at", "output_len")


def same(a, b) -> bool:
    """Equal, tensors bit for bit, lists and tuples element by element."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def runs_match(run, proposer_class, kernel: str, monkeypatch, max_new: int, where, sampled: bool = False) -> bool:
    """A proposer's greedy_run (sampled: its sampled_run; iterations many per call of
    cpu_layer_ops.<kernel>) against the loop's iterations one by one (that run declined on
    `proposer_class`): run(eos, max_new) -> (tokens, stats, *state). For no EOS, an EOS as late as the
    output allows, and a room of 13 tokens (sampled also calls cut after every iteration: each must
    leave the generator where the iterations one by one do): the same tokens (as many as asked for),
    the same iterations, the same state. Returns whether the EOS case ran in C (where the first
    iteration, run in Python, holds the EOS, it does not)."""
    from speclite.engine import loop
    from speclite.kernels import cpu_layer_ops

    calls, real = [], getattr(cpu_layer_ops, kernel)
    declined = "sampled_run" if sampled else "greedy_run"

    def counting(*args):
        out = real(*args)
        calls.append(len(out[0]))  # the call's iterations
        return out

    with monkeypatch.context() as m:
        m.setattr(proposer_class, declined, lambda *a: None)
        plain_out = run(set(), max_new)[0]
    end = max(i for i, t in enumerate(plain_out) if plain_out.index(t) == i)  # a late first occurrence
    eos_in_c = False
    cases = [(set(), max_new, max_new, loop.CHUNK_S), ({plain_out[end]}, max_new, end + 1, loop.CHUNK_S),
             (set(), 13, 13, loop.CHUNK_S)] + ([(set(), max_new, max_new, 1e-6)] if sampled else [])
    for eos, room, length, chunk in cases:
        with monkeypatch.context() as m:
            m.setattr(cpu_layer_ops, kernel, counting)
            m.setattr(loop, "CHUNK_S", chunk)
            ours = run(eos, room)
        assert sum(calls) > (0 if room < max_new else 1) or eos, where  # iterations ran in C (a short room: one may)
        assert chunk > 1e-3 or len(calls) == sum(calls), (where, calls)  # one iteration a call
        eos_in_c |= bool(eos) and sum(calls) > 0
        calls.clear()
        with monkeypatch.context() as m:
            m.setattr(proposer_class, declined, lambda *a: None)
            theirs = run(eos, room)
        assert ours[0] == theirs[0] and len(ours[0]) == length, (where, eos)
        for field in RUN_STATS:
            assert getattr(ours[1], field) == getattr(theirs[1], field), (where, eos, field)
        assert same(ours[2:], theirs[2:]), (where, eos)
    return eos_in_c


@pytest.fixture(params=cpu_build.runnable() or ["none"])
def isa(request):
    """Each CPU kernel ISA path this machine can run (on an AVX-512 machine: AVX-512, and the AVX2
    path forced): a test that takes it runs once per path, with that path's kernels."""
    if request.param == "none":
        pytest.skip("no CPU kernel path here (no AVX2, or SPECLITE_CPU_KERNELS=0)")
    before = os.environ.get("SPECLITE_CPU_ISA")
    os.environ["SPECLITE_CPU_ISA"] = request.param
    cpu_build.isa.cache_clear()
    try:
        yield request.param
    finally:
        if before is None:
            del os.environ["SPECLITE_CPU_ISA"]
        else:
            os.environ["SPECLITE_CPU_ISA"] = before
        cpu_build.isa.cache_clear()
