"""Run every configuration on every prompt, interleaved, and keep each run's raw figures.

Each distinct model is loaded once: one LLM (target) per quant scheme, and each distinct draft
(one per method at most) shared by all of them; a configuration is only a fresh Speculation swapped
into the engine. Load time, prompt tokenisation and building a proposer are never timed; a run's
time is the engine's generate() (prefill + decode loop + detokenisation) between device syncs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from speclite import hub
from speclite.api import LLM, load_draft
from speclite.bench.memory import MemoryMeter
from speclite.bench.prompts import BenchPrompt
from speclite.bench.sweep import BenchConfig
from speclite.engine.loop import Speculation
from speclite.engine.memory import model_bytes
from speclite.model.prepare import prepare
from speclite.sampling import SamplingParams
from speclite.errors import SpecliteError
from speclite.speculate import BuildContext, build_proposer, get_method
from speclite.speculate.schedule import SpecLength, spec_length


@dataclass
class RunRecord:
    """One configuration on one prompt in one repeat."""

    config: str
    repeat: int
    prompt: str
    workload: str
    output_tokens: int
    elapsed_s: float
    iter_count: int
    proposed: int
    accepted: int
    proposed_at: list[int]
    accepted_at: list[int]
    draft_s: float
    verify_s: float
    same_as_plain: bool | None
    finish_reason: str
    token_ids: list[int] = field(repr=False, default_factory=list)
    parts: dict[str, list[int]] = field(default_factory=dict)  # hybrid: part -> [drafted, accepted]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@dataclass
class BenchModels:
    """The loaded models: one LLM per target quant, and the drafts they share."""

    llms: dict[str | None, LLM]
    # draft name -> (the loaded draft model, or None for a head or drafter its method loads itself;
    # its resolved directory: a PARD draft's config names its mask token, a head is read from it)
    drafts: dict[str, tuple[object | None, Path]]
    static: bool = False
    draft_quant: str | None = None  # --draft-quant, also for the heads and drafters a method loads itself

    @classmethod
    def load(cls, model: str, drafts: list[str], quants: list[str | None], *, device, dtype, draft_quant=None,
             models_file=None, max_model_len=None, static=False,
             draft_is_model=lambda draft, draft_dir: True) -> "BenchModels":
        """`draft_is_model(draft, draft_dir)`: load that draft as a model; else (heads, DFlash drafters)
        only resolve its directory."""
        llms = {q: LLM(model, None, device=device, dtype=dtype, quant=q, models_file=models_file,
                       max_model_len=max_model_len, static=static) for q in quants}
        first = next(iter(llms.values()))
        loaded = {}
        for draft in dict.fromkeys(drafts):
            draft_dir = hub.resolve(draft, models_file)
            draft_model = (load_draft(draft, first.tokenizer, str(model), first.device, first.dtype, draft_quant,
                                      models_file) if draft_is_model(draft, draft_dir) else None)
            loaded[draft] = (draft_model, draft_dir)
        return cls(llms, loaded, static, draft_quant)


class Runner:
    def __init__(self, models: BenchModels, configs: list[BenchConfig], prompts: list[BenchPrompt],
                 params: SamplingParams, *, method_options: dict | None = None):
        """params: every run's; sampled (temperature > 0) runs seed each prompt with its index, the same
        for every configuration."""
        drafted = [c.method for c in configs if c.method != "plain" and not c.draft and get_method(c.method).needs_draft]
        if drafted:
            raise SpecliteError(f"--sp-type {drafted[0]} needs a draft: pass --draft (or --synthetic-draft)")
        self.models, self.prompts = models, prompts
        self.params = params
        self.method_options = method_options or {}
        self.device = next(iter(models.llms.values())).device
        self.meter = MemoryMeter(self.device)
        self.peak_bytes: dict[str, int] = {}
        # Tokenise once per (quant, prompt): the encoding is not what is being measured.
        self.inputs = {q: [self._encode(llm, p) for p in prompts] for q, llm in models.llms.items()}
        # One proposer per method (and token map), shared by every k and quant (k is asked per
        # iteration), so the draft's KV cache and its captured CUDA graphs exist once.
        self.proposers = {}
        self.lengths: dict[BenchConfig, SpecLength] = {}  # each configuration's schedule (_speculation)
        for c in configs:
            if c.method != "plain" and c.proposer_key not in self.proposers:
                self.proposers[c.proposer_key] = self._proposer(c)
        # As an LLM does with its own proposer's, before the first forward: the drafts' weights prepared,
        # then (--static) their steps made fixed-shape.
        prepare(*[m for p in self.proposers.values() for m in p.resident()[0]])
        if self.models.static:
            for proposer in self.proposers.values():
                proposer.use_static()
        # A row without --k runs its method's own default k (a DFlash drafter's block size - 1).
        self.configs = [c if c.k is not None else
                        replace(c, k=spec_length(None, get_method(c.method), self.proposers[c.proposer_key]).k)
                        for c in configs]

    @staticmethod
    def _encode(llm: LLM, p: BenchPrompt) -> tuple[list[int], dict]:
        if isinstance(p.prompt, list) and not llm.tokenizer.chat_template:
            # A base model without a chat template reads the conversation as plain text.
            text = "".join(f"{m['role']}: {m['content']}\n" for m in p.prompt) + "assistant:"
            ids = llm.encode(text)
        else:
            ids = llm.encode(p.prompt)
        return ids, llm.extra_config(p.extra)

    def _proposer(self, config: BenchConfig):
        llm = next(iter(self.models.llms.values()))
        cfg = config.spec_config(self.method_options)
        method = get_method(cfg.method)
        draft, draft_dir = self.models.drafts[cfg.draft] if cfg.draft else (None, None)
        if not (method.needs_draft or method.loads_draft_model(cfg.options, draft_dir)):
            draft = None
        return build_proposer(cfg.method, BuildContext(cfg.options, llm.target, draft, llm.max_len, draft_dir,
                                                       self.models.draft_quant))

    def _speculation(self, config: BenchConfig) -> Speculation | None:
        if config.method == "plain":
            return None
        proposer = self.proposers[config.proposer_key]
        cfg = config.spec_config(self.method_options)
        # One schedule per configuration for the whole run (warm-up included), as a session's LLM keeps
        # its own across requests: `auto` learns the machine's costs, not the prompts' answers.
        if config not in self.lengths:
            self.lengths[config] = spec_length(cfg.k, get_method(cfg.method), proposer)
        return Speculation(proposer, self.lengths[config], cfg.verify, cfg.accept_policy)

    def _resident_bytes(self, config: BenchConfig) -> int:
        """Weights plus preallocated KV caches of the models this configuration uses."""
        llm = self.models.llms[config.quant]
        total = model_bytes(llm.target) + llm.engine.cache.nbytes()
        proposer = self.proposers.get(config.proposer_key)
        if proposer is not None:
            models, caches = proposer.resident()
            total += sum(model_bytes(m) for m in models) + sum(c.nbytes() for c in caches)
        return total

    def run_one(self, config: BenchConfig, index: int, params: SamplingParams):
        """(RequestOutput, seconds) of one prompt; the engine starts cold (no cached prefix)."""
        llm = self.models.llms[config.quant]
        ids, extra = self.inputs[config.quant][index]
        llm.engine.spec = self._speculation(config)
        llm.engine.reset()  # target and draft start cold: no prefix kept from the last run
        sync(self.device)
        start = time.perf_counter()
        out = llm.engine.generate(ids, params, extra)
        sync(self.device)
        seconds = time.perf_counter() - start
        llm.engine.spec = None
        return out, seconds

    def warm_up(self) -> None:
        """Every configuration once on the first prompt: allocations, lazy init, CUDA graph capture."""
        for config in self.configs:
            self.run_one(config, 0, self.params)

    def run(self, repeats: int, on_run=None) -> list[RunRecord]:
        """For each repeat, every configuration on all prompts, so drift affects all alike.

        Odd repeats go through the configurations in reverse, so slow drift within a repeat
        (thermal, a neighbour's load) does not always favour the same end of the list.
        """
        records: list[RunRecord] = []
        for r in range(repeats):
            order = self.configs if r % 2 == 0 else list(reversed(self.configs))
            plain_ids: dict[tuple, list[int]] = {}
            this_repeat: list[tuple[RunRecord, tuple]] = []
            for config in order:
                # What a method learns across requests comes from this repeat's prompts only: not from
                # the warm-up or an earlier repeat, which already showed it these very answers.
                if config.proposer_key in self.proposers:
                    self.proposers[config.proposer_key].forget()
                self.meter.start()
                for i, p in enumerate(self.prompts):
                    out, seconds = self.run_one(config, i, self.params if self.params.greedy else replace(self.params, seed=i))
                    s = out.stats
                    rec = RunRecord(config.label, r, p.name, p.workload, len(out.token_ids), seconds, s.iter_count,
                                    s.proposed, s.accepted, list(s.proposed_at), list(s.accepted_at), s.draft_s,
                                    s.verify_s, False, out.finish_reason, list(out.token_ids),
                                    {name: list(tally) for name, tally in s.parts.items()})
                    if config.method == "plain":
                        plain_ids[(config.quant, i)] = rec.token_ids
                    this_repeat.append((rec, (config.quant, i)))
                    if on_run:
                        on_run(rec)
                peak = self._resident_bytes(config) + self.meter.transient_peak()
                self.peak_bytes[config.label] = max(self.peak_bytes.get(config.label, 0), peak)
            # Greedy speculation is lossless: anything but accept_all must reproduce plain's tokens. (Sampled
            # speculation follows the target's distribution, not plain decoding's draws: None.)
            for rec, key in this_repeat:
                rec.same_as_plain = rec.token_ids == plain_ids[key] if self.params.greedy else None
                records.append(rec)
        return records
