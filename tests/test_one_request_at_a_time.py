"""One LLM runs one request at a time (one KV cache): requests from two threads take turns, a stream
left open in part is ended by the next request of its thread (one dropped is ended as it is collected),
and a request's figures count the iterations of the tokens it returns."""

import threading

import pytest

from speclite import LLM, SamplingParams
from speclite.errors import SpecliteError
from speclite.model import Transformer
from speclite.speculate.base import Proposer

PROMPTS = ["def fibonacci(n):\n    if n < 2:\n", "import os\nimport sys\n\n\nclass Config:\n"]
GREEDY = SamplingParams(max_new_tokens=32)


def answers_on_another_thread(llm) -> list:
    """PROMPTS[1]'s greedy tokens from a request on a thread of its own, [] if it waits past a minute."""
    got = []
    waiting = threading.Thread(target=lambda: got.append(llm.generate(PROMPTS[1], GREEDY)[0].token_ids), daemon=True)
    waiting.start()
    waiting.join(timeout=60)
    return got


@pytest.fixture(scope="module")
def references(pair):
    llm = LLM(pair[0])
    return [llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS]


@pytest.mark.parametrize("method", [None, "vanilla"])
def test_two_threads_take_turns(pair, references, method):
    """Both threads' requests ran on the one cache at once and returned each other's continuations."""
    llm = LLM(pair[0], {"method": method, "model": str(pair[1])} if method else None)
    got: dict[int, list] = {0: [], 1: []}
    start = threading.Barrier(2)

    def run(i):
        start.wait()
        for _ in range(3):
            got[i].append(llm.generate(PROMPTS[i], GREEDY)[0].token_ids)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == {i: [references[i]] * 3 for i in (0, 1)}


def test_a_stream_left_open_is_ended_by_the_next_request(pair, references):
    """Read in part and kept: the next request ends it (its result holds what it had), and runs as on a
    fresh LLM; the old stream yields nothing more."""
    llm = LLM(pair[0])
    result = []
    stream = llm.stream(PROMPTS[1], GREEDY, result=result)
    first = [next(stream), next(stream)]
    assert llm.generate(PROMPTS[0], GREEDY)[0].token_ids == references[0]
    assert result[0].token_ids == first[0].token_ids + first[1].token_ids
    assert list(stream) == []
    assert llm.generate(PROMPTS[1], GREEDY)[0].token_ids == references[1]


@pytest.mark.parametrize("keep", [False, True])
def test_a_stream_a_thread_left_as_it_ended_holds_nothing(pair, references, keep):
    """A worker reads part of a stream and ends, the stream dropped (collected) or handed on (kept, never
    read again): a request of any thread ends it and runs (it waited forever: the engine held the stream,
    whose lock stayed taken)."""
    llm = LLM(pair[0])
    kept, result = [], []

    def worker():
        stream = llm.stream(PROMPTS[0], GREEDY, result=result)
        next(stream)
        if keep:
            kept.append(stream)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert answers_on_another_thread(llm) == [references[1]]
    assert [r.finish_reason for r in result] == ["abort"]


def test_a_stream_read_on_another_thread_is_not_ended_by_its_makers_next_request(pair, references):
    """A web server's shape: one thread makes the streams, pool threads read them. The maker's next
    request waits for the stream being read (ending it raised 'generator already executing', or cut it
    short as if it had reached its length)."""
    llm = LLM(pair[0])
    first, second, got = [], [], []
    stream = llm.stream(PROMPTS[0], GREEDY, result=first)
    reading = threading.Event()

    def read():
        for chunk in stream:
            got.extend(chunk.token_ids)
            reading.set()

    thread = threading.Thread(target=read)
    thread.start()
    reading.wait(timeout=60)
    assert [t for chunk in llm.stream(PROMPTS[1], GREEDY, result=second) for t in chunk.token_ids] == references[1]
    thread.join(timeout=60)
    assert got == references[0] and [r.finish_reason for r in first] == ["length"]
    assert [r.token_ids for r in second] == [references[1]]


def test_a_request_interrupted_inside_a_step_leaves_the_llm_as_new(monkeypatch):
    """Ctrl-C inside a drafting step (EAGLE-3's head had taken the pairs but not cached them): the next
    requests of the prompt, or one sharing its start, raised 'cannot roll back a cache of 0 tokens'.
    The interrupted request's result says abort; the LLM then decodes as a fresh one."""
    llm = LLM("tiny-code", {"method": "eagle3"})
    fresh = LLM("tiny-code")
    references = [fresh.generate(p, GREEDY)[0].token_ids for p in PROMPTS]

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    head = llm._speculation.proposer.head
    monkeypatch.setattr(head, "greedy_chain", interrupt)
    result = []
    with pytest.raises(KeyboardInterrupt):
        for _ in llm.stream(PROMPTS[0], GREEDY, result=result):
            pass
    monkeypatch.undo()
    assert [r.finish_reason for r in result] == ["abort"]
    assert [llm.generate(p, GREEDY)[0].token_ids for p in (PROMPTS[0], PROMPTS[0] + "x", PROMPTS[1])] == \
        [references[0], fresh.generate(PROMPTS[0] + "x", GREEDY)[0].token_ids, references[1]]


FIGURES = ("output_len", "iter_count", "accept_rate", "accepted_per_position", "avg_tokens_per_iter")


@pytest.mark.parametrize("method", [None, "vanilla"])
def test_figures_count_the_iterations_up_to_a_stop_string(pair, monkeypatch, method):
    """A kernel call runs many iterations at once and may verify past a stop string; the figures count
    the iterations that made the tokens returned: those of the same request run one iteration a call
    (the calls declined), where the output ends at the stop as soon as it is met."""
    config = {"method": method, "model": str(pair[1]), "num_speculative_tokens": 6} if method else None
    llm = LLM(pair[0], config)
    plain = LLM(pair[0]).generate(PROMPTS[0], SamplingParams(max_new_tokens=48))[0].text
    params = SamplingParams(max_new_tokens=48, stop=[plain[30:33]])
    out = llm.generate(PROMPTS[0], params)[0]
    assert out.finish_reason == "stop" and out.aux_info["output_len"] == len(out.token_ids)
    if method is None:
        assert out.aux_info["iter_count"] == len(out.token_ids)
    monkeypatch.setattr(Transformer, "chain", lambda *args, **kwargs: None)
    monkeypatch.setattr(Proposer, "greedy_run", lambda *args, **kwargs: None)
    one_by_one = LLM(pair[0], config).generate(PROMPTS[0], params)[0]
    assert one_by_one.token_ids == out.token_ids
    assert {f: out.aux_info[f] for f in FIGURES} == {f: one_by_one.aux_info[f] for f in FIGURES}


def test_sampling_params_changed_after_construction_are_checked_again(pair):
    params = SamplingParams(max_new_tokens=4)
    params.temperature = -1
    with pytest.raises(SpecliteError, match="temperature must be >= 0"):
        LLM(pair[0]).generate(PROMPTS[0], params)


def test_a_stop_string_set_after_construction_is_one_string(pair):
    """stop = "xy" set on a made SamplingParams is the stop "xy", as SamplingParams(stop="xy") (each of
    its characters was a stop)."""
    llm = LLM(pair[0])
    text = llm.generate(PROMPTS[0], GREEDY)[0].text
    # Two characters met first together well into the text, the first of them met alone before.
    stop = next(text[i : i + 2] for i in range(8, len(text) - 1)
                if text[i] in text[:i] and text.index(text[i : i + 2]) == i)
    params = SamplingParams(max_new_tokens=32)
    params.stop = stop
    assert llm.generate(PROMPTS[0], params)[0].text == llm.generate(PROMPTS[0], SamplingParams(
        max_new_tokens=32, stop=stop))[0].text == text[: text.index(stop)]


@pytest.mark.parametrize("method", [None, "vanilla"])
def test_a_temperature_below_greedys_bound_decodes_greedily(pair, references, method):
    """1e-38 divided the logits into infinities: NaN probabilities and random text. A top_p that keeps
    the top token alone decodes greedily too."""
    llm = LLM(pair[0], {"method": method, "model": str(pair[1])} if method else None)
    for temperature in (1e-38, 1e-6):
        assert llm.generate(PROMPTS[0], SamplingParams(max_new_tokens=32, temperature=temperature, seed=3))[0] \
            .token_ids == references[0]
    # A top_p under float32's smallest number was 0 there, masking every token: the last one came out.
    assert llm.generate(PROMPTS[0], SamplingParams(max_new_tokens=32, temperature=1.0, top_p=1e-50, seed=3))[0] \
        .token_ids == references[0]


@pytest.mark.parametrize("method", [None, "vanilla"])
def test_a_streamed_answer_with_a_stop_string_is_the_whole_answer(pair, method):
    """A stop string that begins in one chunk and ends in a later one: the text streamed before it was
    found is the answer's (held back while it could still become the stop), never more; streamed text
    joined equals the answer's text, for stops across the whole output."""
    llm = LLM(pair[0], {"method": method, "model": str(pair[1])} if method else None)
    full = llm.generate(PROMPTS[0], GREEDY)[0].text
    for start in range(1, len(full) - 4, 3):
        stop = full[start : start + 4]
        params = SamplingParams(max_new_tokens=32, stop=[stop, "\x00never"])
        answer = llm.generate(PROMPTS[0], params)[0].text
        streamed = "".join(chunk.text for chunk in llm.stream(PROMPTS[0], params))
        assert streamed == answer == full[: full.index(stop)], (stop, streamed, answer)
    # The output ends in the start of a stop string that never comes: held back, then sent at the end.
    params = SamplingParams(max_new_tokens=32, stop=[full[-3:] + "\x01"])
    assert "".join(chunk.text for chunk in llm.stream(PROMPTS[0], params)) == full


def test_a_streamed_answer_cut_inside_a_character_ends_as_the_answer():
    """An answer that max_new_tokens cuts between the bytes of one character ends in U+FFFD; the stream
    held that character back and, without a stop string, never sent it."""
    llm = LLM("tiny-code")
    cut = 0
    for seed in range(120):  # 47 and 64 draw a byte token first at this temperature
        params = SamplingParams(max_new_tokens=1, temperature=20.0, seed=seed)
        text = llm.generate("s = 'x", params)[0].text
        if text.endswith("\ufffd"):
            cut += 1
            assert "".join(chunk.text for chunk in llm.stream("s = 'x", params)) == text, seed
    assert cut >= 2


@pytest.mark.parametrize("method", ["vanilla", "eagle3", "pard"])
def test_figures_of_an_answer_ended_inside_an_iteration(method):
    """Every iteration puts out its drafts that stood and the target's token, but the one an EOS among its
    drafts (or a stop string) ends puts out fewer: its drafts after the end never became output and do not
    count as accepted (the chat's panel showed an acceptance the tokens per iteration contradicted)."""
    llm = LLM("tiny-code", {"method": method})
    messages = [{"role": "user", "content": "def add(a, b):"}]
    answer = llm.generate(messages, SamplingParams(max_new_tokens=200))[0]
    stop = answer.text[len(answer.text) // 2 : len(answer.text) // 2 + 3]
    ends = 0
    for params in (SamplingParams(max_new_tokens=200), SamplingParams(max_new_tokens=200, stop=[stop])):
        out = llm.generate(messages, params)[0]
        ends += out.finish_reason == "stop"
        s = out.stats
        assert s.output_len - s.iter_count <= s.accepted <= s.output_len - s.iter_count + 1, out.aux_info
        assert s.accepted == sum(s.accepted_at) and all(a <= p for a, p in zip(s.accepted_at, s.proposed_at))
    assert ends == 2


def test_a_stream_closed_after_its_last_chunk_ended_as_it_did():
    """A consumer that stops reading at the chunk with the EOS (or the last of max_new_tokens) and closes
    the stream: its finish_reason is the answer's (it said abort)."""
    llm = LLM("tiny-code")
    messages = [{"role": "user", "content": "def add(a, b):"}]
    whole = llm.generate(messages, SamplingParams(max_new_tokens=200))[0]
    assert whole.finish_reason == "stop"
    for params, reason in ((SamplingParams(max_new_tokens=200), "stop"), (SamplingParams(max_new_tokens=5), "length")):
        result, got = [], []
        stream = llm.stream(messages, params, result=result)
        for chunk in stream:
            got += chunk.token_ids
            if llm.engine.eos_ids & set(chunk.token_ids) or len(got) == params.max_new_tokens:
                break
        stream.close()
        assert [r.finish_reason for r in result] == [reason]


def test_an_interrupt_right_after_a_request_takes_its_turn_leaves_none_held(pair, references, monkeypatch):
    """Ctrl-C between taking the turn and the request's first step: the turn was left taken (a lock taken
    in one call, released in a later finally) and every later request waited forever."""
    from speclite.engine.engine import Engine

    take = Engine._take_turn

    def interrupted(self, mark):
        take(self, mark)
        raise KeyboardInterrupt

    llm = LLM(pair[0])
    monkeypatch.setattr(Engine, "_take_turn", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS[0], GREEDY)
    monkeypatch.undo()
    assert answers_on_another_thread(llm) == [references[1]]


def test_a_stream_never_read_and_ended_by_the_next_request_says_so(pair, references):
    """Two streams made before either is read: the second's request ends the first, whose result stayed
    empty (its body never ran); it holds an abort with no tokens now."""
    llm = LLM(pair[0])
    first, second = [], []
    unread = llm.stream(PROMPTS[0], GREEDY, result=first)
    assert [t for chunk in llm.stream(PROMPTS[1], GREEDY, result=second) for t in chunk.token_ids] == references[1]
    assert list(unread) == [] and [(r.finish_reason, r.token_ids) for r in first] == [("abort", [])]
    assert [r.token_ids for r in second] == [references[1]]


def test_sampling_params_take_vllms_max_tokens(pair, references):
    params = SamplingParams(max_tokens=5)
    assert params.max_new_tokens == 5 and LLM(pair[0]).generate(PROMPTS[1], params)[0].token_ids == references[1][:5]


@pytest.mark.parametrize("method", [None, "vanilla"])
def test_stop_token_ids_end_the_answer_at_the_first_one(pair, references, method):
    """vLLM's stop_token_ids: the answer ends with the first of them it produces (kept, as an EOS), also
    under ignore_eos, in the kernels' calls and in the loop's own iterations alike."""
    llm = LLM(pair[0], {"method": method, "model": str(pair[1])} if method else None)
    ids = references[1]
    token = next(t for t in ids[6:] if ids.index(t) >= 6)  # met first past the start
    for ignore_eos in (False, True):
        out = llm.generate(PROMPTS[1], SamplingParams(max_new_tokens=32, stop_token_ids=[token], ignore_eos=ignore_eos))[0]
        assert out.token_ids == ids[: ids.index(token) + 1] and out.finish_reason == "stop"
    with pytest.raises(SpecliteError, match="stop_token_ids must be a list of token ids"):
        SamplingParams(stop_token_ids=[-1])
