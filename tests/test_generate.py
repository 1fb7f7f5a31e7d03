"""Plain generation: greedy equals transformers' generate; sampling, stop strings, limits."""

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from speclite import LLM, SamplingParams
from speclite.engine import loop
from speclite.kernels import cpu_layer_ops
from speclite.model import Transformer
from speclite.sampling import argmax, row_argmaxes, sample, warp

PROMPTS = ["def add(a, b):", "the quick brown", "import os\nimport sys\n", '{"id": 1, "name":']


def hf_greedy(model_dir, tokenizer, prompt, n):
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer.encode(prompt)])
    out = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                       pad_token_id=tokenizer.pad_token_id)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_greedy_equals_transformers_generate(model_dirs, tokenizer, family):
    llm = LLM(model_dirs[family], device="cpu")
    outputs = llm.generate(PROMPTS, SamplingParams(max_new_tokens=24))
    for prompt, out in zip(PROMPTS, outputs):
        assert out.token_ids == hf_greedy(model_dirs[family], tokenizer, prompt, 24)
        assert out.finish_reason in ("length", "stop")
        assert out.aux_info["output_len"] == len(out.token_ids)


def test_chat_messages_use_the_template(model_dirs, tokenizer):
    llm = LLM(model_dirs["qwen2"])
    messages = [{"role": "user", "content": "hi"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert llm.encode(messages) == tokenizer.encode(rendered, add_special_tokens=False)
    assert llm.generate(messages, SamplingParams(max_new_tokens=5))[0].token_ids


def test_stop_string_truncates_text(model_dirs, tokenizer):
    # Early and late stops (the loop's calls grow as the output does): the text ends before the stop,
    # the token ids with the token that completes it.
    llm = LLM(model_dirs["qwen2"])
    full = llm.generate("def add(a, b):", SamplingParams(max_new_tokens=30, ignore_eos=True))[0]
    for start in (1, 5, len(full.text) // 2, len(full.text) - 4):
        stop = full.text[start : start + 3]
        out = llm.generate("def add(a, b):", SamplingParams(max_new_tokens=30, stop=[stop], ignore_eos=True))[0]
        assert out.finish_reason == "stop"
        assert out.text == full.text[: full.text.index(stop)]
        ends = next(n for n in range(1, 31) if stop in tokenizer.decode(full.token_ids[:n], skip_special_tokens=True))
        assert out.token_ids == full.token_ids[:ends]


def test_generate_text_equals_the_streamed_text_and_the_tokenizers_decoding(model_dirs, tokenizer):
    # generate decodes once at the end; stream decodes as it goes: the same text either way.
    llm = LLM(model_dirs["qwen2"])
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    for prompt in PROMPTS:
        out = llm.generate(prompt, params)[0]
        result = []
        streamed = "".join(chunk.text for chunk in llm.stream(prompt, params, result=result))
        assert out.token_ids == result[0].token_ids
        assert out.text == streamed == result[0].text == tokenizer.decode(out.token_ids, skip_special_tokens=True)


@pytest.mark.skipif(not cpu_layer_ops.available(), reason="no AVX2 CPU or no C++ compiler here")
def test_plain_greedy_decoding_in_chunks_equals_single_steps(model_dirs, monkeypatch):
    # The target continuing itself for a chunk of steps in one call gives the tokens, statistics and
    # cache of single steps, an EOS inside a chunk included, and the next request reuses that cache.
    llm = LLM(model_dirs["qwen2"], device="cpu")
    chains = []
    chain = Transformer.chain

    def spy(self, *args):
        out = chain(self, *args)
        chains.append(out[0])
        return out

    monkeypatch.setattr(Transformer, "chain", spy)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)

    def run(chunk_s, eos=None):
        monkeypatch.setattr(loop, "CHUNK_S", chunk_s)
        llm.engine.eos_ids = {eos} if eos is not None else set()
        first = llm.generate("def add(a, b):", replace(params, ignore_eos=eos is None))[0]
        second = llm.generate("def add(a, b):" + first.text + "\n", params)[0]  # reuses the cached prefix
        return [(o.token_ids, o.text, o.finish_reason, o.aux_info["iter_count"]) for o in (first, second)]

    stepwise = run(0.0)
    assert chains == []
    assert run(1.0) == stepwise and any(chains)
    eos = stepwise[0][0][20]
    chains.clear()
    chunked = run(1.0, eos)
    assert chunked == run(0.0, eos) and any(chains)
    assert chunked[0][0][-1] == eos and chunked[0][2] == "stop" and len(chunked[0][0]) <= 21


def test_eos_stops_generation(model_dirs, tokenizer):
    llm = LLM(model_dirs["qwen2"])
    free = llm.generate("the quick brown", SamplingParams(max_new_tokens=12, ignore_eos=True))[0]
    llm.engine.eos_ids = {free.token_ids[3]}  # pretend the 4th token is EOS
    out = llm.generate("the quick brown", SamplingParams(max_new_tokens=12))[0]
    first = free.token_ids.index(free.token_ids[3])
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.finish_reason == "stop"


def test_max_new_tokens_is_exact(model_dirs):
    llm = LLM(model_dirs["llama"])
    out = llm.generate("for i in", SamplingParams(max_new_tokens=7, ignore_eos=True))[0]
    assert len(out.token_ids) == 7 and out.finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_varies(model_dirs):
    llm = LLM(model_dirs["qwen2"])
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=7, ignore_eos=True)
    a, b = (llm.generate("def add", params)[0].token_ids for _ in range(2))
    assert a == b
    others = {tuple(llm.generate("def add", SamplingParams(max_new_tokens=16, temperature=1.0, seed=s,
                                                           ignore_eos=True))[0].token_ids) for s in range(5)}
    assert len(others) > 1


def test_warp_matches_reference_math():
    torch.manual_seed(0)
    logits = torch.randn(50, dtype=torch.float64)
    params = SamplingParams(temperature=0.7, top_k=10, top_p=0.8)
    probs = warp(logits, params).double()
    # Independent: temperature, keep the 10 largest, then the smallest prefix with mass >= 0.8.
    p = torch.softmax(logits / 0.7, dim=-1)
    order = torch.argsort(p, descending=True)
    top = order[:10]
    q = p[top] / p[top].sum()
    keep, mass = [], 0.0
    for idx, pr in zip(top.tolist(), q.tolist()):
        keep.append(idx)
        mass += pr
        if mass >= 0.8:
            break
    expected = torch.zeros_like(p)
    expected[keep] = p[keep] / p[keep].sum()
    assert torch.allclose(probs, expected, atol=1e-6)


def test_inverse_cdf_sample_follows_probs():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    picks = [sample(probs, torch.tensor(u)) for u in (0.05, 0.11, 0.5, 0.69, 0.71, 0.99)]
    assert picks == [0, 2, 2, 2, 3, 3]


def test_prompt_longer_than_context_is_clear(model_dirs):
    from speclite.errors import SpecliteError

    llm = LLM(model_dirs["qwen2"], max_model_len=16)
    with pytest.raises(SpecliteError, match="does not fit the maximum context length"):
        llm.generate("the quick brown fox " * 20, SamplingParams(max_new_tokens=4))
    with pytest.raises(SpecliteError, match="does not fit the maximum context length"):
        llm.stream("the quick brown fox " * 20)  # at the call, not at the stream's first read


def test_streamed_text_equals_final_text(model_dirs, tokenizer):
    from speclite.engine.detokenize import IncrementalDetokenizer

    llm = LLM(model_dirs["qwen3"])
    result = []
    chunks = list(llm.stream("def add(a, b):", SamplingParams(max_new_tokens=40, ignore_eos=True), result=result))
    out = result[0]
    streamed = "".join(c.text for c in chunks)
    assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)
    # Random tokens may end inside a UTF-8 sequence: streaming holds back only that one character.
    assert out.text.startswith(streamed) and out.text[len(streamed):] in ("", "\ufffd")
    assert len(streamed) > 20
    # Multi-byte characters split across byte-level tokens are held back until complete.
    ids = tokenizer.encode("naïve café ☕ done")
    detok = IncrementalDetokenizer(tokenizer)
    seen = [detok.add([t]) for t in ids]
    assert all("\ufffd" not in s for s in seen) and seen[-1] == detok.final() == "naïve café ☕ done"
    # Bytes that never form a character do not hold back what follows them: every token's text
    # streams out at once except a possibly incomplete last character.
    # Byte 0x80 alone (a continuation byte, never valid here): byte-level BPE writes it as chr(256 + 34),
    # after the 33 bytes 0-32 and 127 that its alphabet also moves past 255.
    stray = tokenizer.convert_tokens_to_ids([chr(256 + 34)])
    assert tokenizer.decode(stray) == "\ufffd"
    detok = IncrementalDetokenizer(tokenizer)
    for piece in ("ab", "cd", "ef"):
        detok.add(stray + tokenizer.encode(piece))
    assert detok.text == detok.final() == "\ufffdab\ufffdcd\ufffdef"
    detok.add(tokenizer.encode("é")[:1])  # the first byte of a two-byte character: held back
    assert detok.text == "\ufffdab\ufffdcd\ufffdef" and detok.final().endswith("\ufffd")
    # Back to a mark (the engine replays a call's tokens one by one where a stop string is in them): the
    # same texts, token by token, as a detokenizer that never saw what came after the mark.
    ids = tokenizer.encode("x = 1\nnaïve café ☕ done\ny = 2")
    detok, fresh = IncrementalDetokenizer(tokenizer), IncrementalDetokenizer(tokenizer)
    detok.add(ids[:3]), fresh.add(ids[:3])
    mark = detok.mark()
    detok.add(ids[3:])
    detok.back_to(mark)
    assert [detok.add([t]) for t in ids[3:]] == [fresh.add([t]) for t in ids[3:]]
    assert detok.ids == fresh.ids == ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("case", ["random", "ties", "nan", "all -inf", "strided row"])
def test_argmax_is_torchs_first_largest_index_of_a_row_and_of_every_row(dtype, case):
    torch.manual_seed(5)
    logits = torch.randn(3, 4096, dtype=torch.float64).to(dtype)
    row = logits[1]
    if case == "ties":
        row[[100, 7, 3000]] = row.max() + 1
    elif case == "nan":
        row[[900, 2000]] = float("nan")
    elif case == "all -inf":
        row.fill_(float("-inf"))
    elif case == "strided row":
        row = logits[:, 5]
    assert argmax(row) == int(torch.argmax(row))
    assert row_argmaxes(logits) == logits.argmax(dim=-1).tolist()
