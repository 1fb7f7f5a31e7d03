"""Hybrid drafting through the real loop: greedy output equals plain decoding for each model part
(draft model, EAGLE-3 head, MTP module) at several k and N, on a float32 and an int4 target; the
per-part acceptance matches a replay of the proposals against the output; bad flags are one line;
`speclite generate --sp-type hybrid` end to end."""

import json
import random
import shutil

import pytest
import torch
from rich.console import Console

from conftest import cli_generate, save_model, save_noisy_copy, decode_all
from eagle3_heads import save_head
from mtp_modules import add_module, save_separate
from speclite import hub
from speclite.api import SpecConfig
from speclite.chat.view import Setup, stats_line, stats_panel
from speclite.engine.loop import Speculation
from speclite.model import load_model
from speclite.quant import quantize_model
from speclite.render import summary_table
from speclite.sampling import SamplingParams
from speclite.speculate import BuildContext, build_proposer, get_method, method_options
from speclite.speculate.schedule import SpecLength
from test_hardening import ASSETS, run_main
from test_sampling_exact import one_thread

GREEDY = SamplingParams(max_new_tokens=20, ignore_eos=True)
rng = random.Random(11)
PROMPTS = [[rng.randrange(300) for _ in range(rng.randrange(3, 12))] for _ in range(3)]
PROMPTS += [[7, 8, 9, 10] * 4, [40, 41, 42] * 5 + [40]]  # repetitive: prompt lookup hits
# (k, N): drafts per iteration, of which the model drafts N.
SHAPES = [(1, 1), (3, 1), (4, 2), (4, 0), (6, 6)]


def generate(target, prompt, spec=None, params=GREEDY):
    return decode_all(target, prompt, params, spec, cache_len=96)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A llama target carrying a DeepSeek-V3 MTP module, a noisy copy as draft model, an EAGLE-3
    head and a separate MTP module for it."""
    root = tmp_path_factory.mktemp("hybrid")
    save_model(root / "target", "llama", seed=5, hidden=64, layers=6, intermediate_size=128)
    save_noisy_copy(root / "target", root / "draft", noise=0.2, seed=2)
    add_module(root / "target", "deepseek", seed=3)
    vocab = json.loads((root / "target" / "config.json").read_text())["vocab_size"]
    save_head(root / "head", "specforge", 64, vocab, None, seed=3, scale=4.0, inter=128)
    save_separate(root / "module", root / "target", "deepseek", seed=7)
    return root


def hybrid(target, dirs, draft, k, steps, draft_quant=None, **options):
    """The hybrid proposer as the runtime builds it: the model part found from --draft."""
    options = method_options("hybrid", {"hybrid_model_steps": steps, **options}, k)
    draft_dir = dirs / draft if draft else None
    draft_model = load_model(draft_dir, "cpu", torch.float32) if draft == "draft" else None
    return build_proposer("hybrid", BuildContext(options, target, draft_model, 96, draft_dir, draft_quant))


@pytest.fixture(scope="module")
def target(dirs):
    with one_thread():
        yield load_model(dirs / "target", "cpu", torch.float32)


@pytest.fixture(scope="module")
def plain(target):
    return [generate(target, p)[0] for p in PROMPTS]


@pytest.mark.parametrize("draft, kind", [("draft", "vanilla"), ("head", "eagle3"), (None, "mtp"), ("module", "mtp")])
def test_greedy_identical_to_plain(target, dirs, plain, draft, kind):
    parts = {}
    for k, steps in SHAPES:
        proposer = hybrid(target, dirs, draft, k, steps)
        assert proposer.model_name == kind
        for i, prompt in enumerate(PROMPTS):
            out, stats = generate(target, prompt, Speculation(proposer, SpecLength(k)))
            assert out == plain[i], (draft, k, steps, i)
            for name, (drafted, accepted) in stats.parts.items():
                parts.setdefault(name, [0, 0])
                parts[name] = [parts[name][0] + drafted, parts[name][1] + accepted]
    # Every part drafted (suffix where lookup found nothing) and n-gram drafts stood; a random head's
    # own drafts rarely stand over 320 tokens: test_per_part_acceptance has a model part that does.
    assert set(parts) == {kind, "lookup", "suffix"} and all(drafted > 0 for drafted, _ in parts.values()), parts
    assert parts["lookup"][1] > 0, parts


def test_int4_target(dirs):
    target = quantize_model(load_model(dirs / "target", "cpu", torch.float32), "int4", group_size=32)
    with one_thread():
        plain = [generate(target, p)[0] for p in PROMPTS[2:4]]
        for draft, quant in (("draft", None), ("head", "int4"), (None, None), ("module", "int4")):
            proposer = hybrid(target, dirs, draft, 4, 2, quant)
            for i, prompt in enumerate(PROMPTS[2:4]):
                assert generate(target, prompt, Speculation(proposer, SpecLength(4)))[0] == plain[i], (draft, i)


def test_no_fillers_drafts_the_models_part_alone(target, dirs, plain):
    """--hybrid-fill '': each proposal is the model's N drafts, nothing after them; output as plain."""
    proposer = hybrid(target, dirs, "draft", 4, 2, hybrid_fill="")
    proposals, propose = [], proposer.propose
    proposer.propose = lambda k: proposals.append(propose(k)) or proposals[-1]
    assert generate(target, PROMPTS[-1], Speculation(proposer, SpecLength(4)))[0] == plain[-1]
    assert proposals and all(p.parts == (("vanilla", len(p.tokens)),) and 0 < len(p.tokens) <= 2 for p in proposals)


def replay(proposals, out):
    """Per-part (drafted, accepted) recomputed from the proposals and the output: under greedy
    verification a draft stands exactly when it and the drafts before it equal the output there."""
    parts, pos = {}, 0
    for proposal in proposals:
        standing = 0
        while standing < len(proposal.tokens) and proposal.tokens[standing] == out[pos + standing]:
            standing += 1
        start = 0
        for name, count in proposal.parts:
            drafted, accepted = parts.get(name, (0, 0))
            parts[name] = (drafted + count, accepted + min(max(standing - start, 0), count))
            start += count
        pos += standing + 1
    return parts


@pytest.mark.parametrize("policy", ["normal", "accept_all", "reject_all"])
def test_per_part_acceptance(dirs, policy):
    """The target as its own draft model: its model drafts always stand (greedy), and on a
    repetitive prompt the target repeats, so the lookup drafts after them stand too."""
    target = load_model(dirs / "target", "cpu", torch.float32)  # its own copy: it is its draft too
    options = method_options("hybrid", {"hybrid_model_steps": 1, "hybrid_model": "vanilla"}, 4)
    proposer = build_proposer("hybrid", BuildContext(options, target, target, 96, dirs / "target"))
    proposals, propose = [], proposer.propose
    proposer.propose = lambda k: proposals.append(propose(k)) or proposals[-1]
    spec = Speculation(proposer, SpecLength(4), accept_policy=policy)
    out, stats = generate(target, PROMPTS[-1], spec, SamplingParams(max_new_tokens=40, ignore_eos=True))
    parts = {name: tuple(tally) for name, tally in stats.parts.items()}
    assert sum(d for d, _ in parts.values()) == stats.proposed and sum(a for _, a in parts.values()) == stats.accepted
    if policy == "accept_all":
        assert all(a == d for d, a in parts.values()) and parts["lookup"][0] > 0
    elif policy == "reject_all":
        assert all(a == 0 for _, a in parts.values()) and parts["vanilla"][0] > 0
    else:
        assert parts == replay(proposals, out)
        assert parts["vanilla"][1] == parts["vanilla"][0] > 0  # the target drafting for itself
        assert parts["lookup"][1] > 0
        info = stats.aux_info()["accepted_by_part"]
        assert info["lookup"] == {"drafted": parts["lookup"][0], "accepted": parts["lookup"][1]}
        # The generate summary and chat's live panel and plain line show the same figures.
        shown = f"lookup {parts['lookup'][1]}/{parts['lookup'][0]}"
        setup = Setup("hybrid", "4", "target", "target")
        console = Console(record=True, width=200)
        console.print(summary_table(stats, "t"), stats_panel(stats, setup, width=200))
        assert console.export_text().count(shown) == 2 and shown in stats_line(stats, setup)


BAD_FLAGS = [
    ("steps over k", ["--hybrid-model-steps", "5", "--gen-num-per-cycle", "4"],
     "--hybrid-model-steps (5) must not exceed --gen-num-per-cycle (4)"),
    ("negative steps", ["--hybrid-model-steps", "-1"], "--hybrid-model-steps must be at least 0"),
    ("unknown model", ["--hybrid-model", "medusa"], "--hybrid-model must be one of vanilla, eagle3, mtp"),
    ("unknown filler", ["--hybrid-fill", "lookup,tree"], "--hybrid-fill takes distinct names from lookup, suffix"),

    ("eagle3 given a model", ["--hybrid-model", "eagle3", "--draft", ASSETS / "tiny-code-draft"],
     "is not an EAGLE-3 head"),
    ("filler bounds", ["--sp-min-token-match", "3", "--sp-max-token-match", "2"], "need 1 <= --sp-min-token-match"),
]


@pytest.mark.parametrize("name, flags, message", BAD_FLAGS, ids=[c[0] for c in BAD_FLAGS])
def test_bad_flags_are_one_line(monkeypatch, capsys, tmp_path, name, flags, message):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": 0, "prompt": "def f():"}) + "\n")
    code, err = run_main(monkeypatch, capsys, ["generate", "--model", ASSETS / "tiny-code", "-i", inp,
                                               "-o", tmp_path / "out.jsonl", "--sp-type", "hybrid", *flags])
    assert code == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and message in err, err


@pytest.mark.parametrize("flags, message", [
    ([], "--sp-type hybrid needs --draft"),
    (["--hybrid-model", "vanilla"], "--hybrid-model vanilla needs --draft"),
])
def test_no_draft_and_none_recommended_is_one_line(monkeypatch, capsys, tmp_path, flags, message):
    """A target models.toml names no draft for (a copy of tiny-code) and that has no MTP module."""
    target = shutil.copytree(ASSETS / "tiny-code", tmp_path / "target")
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": 0, "prompt": "def f():"}) + "\n")
    code, err = run_main(monkeypatch, capsys, ["generate", "--model", target, "-i", inp, "-o", tmp_path / "out.jsonl",
                                               "--sp-type", "hybrid", *flags])
    assert code == 1 and len(err.strip().splitlines()) == 1 and err.startswith("error: ") and message in err, err


@pytest.mark.parametrize("part, draft", [("", "tiny-code-mtp"), ("vanilla", "tiny-code-draft"),
                                         ("eagle3", "tiny-code-eagle3")])
def test_recommended_draft_follows_the_model_part(part, draft):
    """Without --draft, hybrid takes models.toml's draft for its model part (its own entry by default)."""
    cfg = SpecConfig("hybrid", options={"hybrid_model": part} if part else {}).validated()
    assert hub.recommended_draft("tiny-code", method=get_method("hybrid").recommends(cfg.options)) == draft


def test_cli_generate_equals_plain(dirs, tmp_path):
    """--draft a model (loaded and checked by the runtime) and --draft a head (found from its config)."""
    plain = {i: r["token_ids"] for i, r in cli_generate(dirs / "target", tmp_path, "plain.jsonl").items()}
    for draft in ("draft", "head"):
        out = cli_generate(dirs / "target", tmp_path, f"{draft}.jsonl", "--sp-type", "hybrid", "--draft",
                           str(dirs / draft), "--hybrid-model-steps", "2", "--gen-num-per-cycle", "4")
        assert {i: r["token_ids"] for i, r in out.items()} == plain, draft
        assert all(r["aux_info"]["accepted_by_part"].keys() == {"vanilla" if draft == "draft" else "eagle3", "lookup",
                                                                 "suffix"} for r in out.values())


def test_bench_reports_acceptance_by_part(dirs, tmp_path):
    from test_bench import FAST, bench

    out = tmp_path / "b.json"
    text = bench("--model", dirs / "target", "--draft", dirs / "draft", "--sp-type", "hybrid", "--k", 3,
                 "--hybrid-model-steps", 1, "--prompts", "builtin:code", "--max-new-tokens", 8, *FAST, "--json", out)
    data = json.loads(out.read_text())
    row = next(r for r in data["configs"] if r["method"] == "hybrid")
    assert row["by_part"].keys() == {"vanilla", "lookup", "suffix"}
    assert sum(d for d, _ in row["by_part"].values()) == row["proposed"]
    assert sum(a for _, a in row["by_part"].values()) == row["accepted"]
    assert row["same_as_plain"] == row["runs"]
    assert "by part" in text and f"vanilla {row['by_part']['vanilla'][1]}/" in text
