"""Batch generation from JSONL: every result appended and flushed as it finishes, resumable by id."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from speclite.engine.sampling import SamplingParams
from speclite.engine.stats import RequestStats
from speclite.errors import SpecliteError

# Per-line fields that override the command's sampling flags.
PER_LINE_PARAMS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop")


@dataclass
class Job:
    key: str  # json of the id: how finished records are recognised on a re-run
    record: dict  # "id" or "line": what the output line is keyed by
    prompt: object = None  # a string or a list of chat messages
    params: SamplingParams | None = None
    extra: dict = field(default_factory=dict)
    error: str | None = None


@dataclass
class BatchSummary:
    total: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0
    stats: RequestStats = field(default_factory=RequestStats)


def check_output_writable(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a"):
            pass
    except OSError as e:
        raise SpecliteError(f"cannot write the output file {path}: {e.strerror}") from None


def finished_keys(path: Path) -> set[str]:
    """Keys of every record already in the output (results and errors alike)."""
    keys: set[str] = set()
    if not path.exists():
        return keys
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash: that request runs again
        if isinstance(rec, dict) and "id" in rec:
            keys.add(json.dumps(rec["id"]))
        elif isinstance(rec, dict) and "line" in rec:
            keys.add(f"line:{rec['line']}")
    return keys


def parse_jobs(path: Path, defaults: SamplingParams) -> list[Job]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise SpecliteError(f"input file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecliteError(f"cannot read the input file {path}: {e}") from None
    jobs = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            jobs.append(_parse(number, line, defaults))
    return jobs


def request_body(rec: dict) -> tuple[str | list[dict], dict]:
    """(prompt or chat messages, extra_config) of one JSONL request line; SpecliteError if malformed."""
    prompt = rec.get("messages", rec.get("prompt"))
    valid = (isinstance(prompt, str) and prompt) or (isinstance(prompt, list) and prompt and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt))
    if not valid:
        raise SpecliteError("needs a non-empty 'prompt' string or 'messages' list of {role, content}")
    extra = rec.get("extra_config") or {}
    if not isinstance(extra, dict):
        raise SpecliteError("extra_config must be an object")
    return prompt, extra


def _parse(number: int, line: str, defaults: SamplingParams) -> Job:
    def bad(message: str, rec: dict | None = None) -> Job:
        if rec is not None and "id" in rec:
            return Job(json.dumps(rec["id"]), {"id": rec["id"]}, error=message)
        return Job(f"line:{number}", {"line": number}, error=message)

    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        return bad(f"line {number} is not valid JSON: {e.msg}")
    if not isinstance(rec, dict):
        return bad(f"line {number} is not a JSON object")
    if "id" in rec and not isinstance(rec["id"], (str, int)):
        return bad(f"line {number}: id must be a string or an integer")
    try:
        prompt, extra = request_body(rec)
    except SpecliteError as e:
        return bad(f"line {number}: {e}", rec)
    overrides = {k: rec[k] for k in PER_LINE_PARAMS if rec.get(k) is not None}
    base = {f.name: getattr(defaults, f.name) for f in fields(SamplingParams)}
    try:
        params = SamplingParams(**{**base, **overrides})
    except (SpecliteError, TypeError) as e:
        return bad(f"line {number}: {e}", rec)
    record_id = rec.get("id", number)
    return Job(json.dumps(record_id), {"id": record_id}, prompt, params, extra)


def run_batch(
    llm,
    jobs: list[Job],
    output_path: Path,
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[dict], None] | None = None,
) -> BatchSummary:
    """Generate every job not yet recorded in output_path, appending and flushing each result."""
    check_output_writable(output_path)
    done = finished_keys(output_path)
    summary = BatchSummary(total=len(jobs))
    pending = [j for j in jobs if j.key not in done]
    summary.skipped = len(jobs) - len(pending)
    if on_start:
        on_start(len(pending))
    with open(output_path, "a+", encoding="utf-8") as out:
        _end_with_newline(out)
        for job in pending:
            record = dict(job.record)
            if job.error is None:
                try:
                    result = llm.generate(job.prompt, job.params, job.extra)[0]
                    record.update(text=result.text, token_ids=result.token_ids,
                                  finish_reason=result.finish_reason, aux_info=result.aux_info)
                    summary.stats.merge(result.stats)
                except SpecliteError as e:
                    record["error"] = str(e)
                except torch.OutOfMemoryError:
                    record["error"] = "out of memory: try a shorter max_new_tokens or --quant int4"
            else:
                record["error"] = job.error
            summary.failed += "error" in record
            summary.done += "error" not in record
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
            if on_result:
                on_result(record)
    return summary


def _end_with_newline(out) -> None:
    """A crash may have cut the last line short: start appending on a fresh line."""
    out.seek(0, os.SEEK_END)
    if out.tell() == 0:
        return
    out.seek(out.tell() - 1)
    if out.read(1) != "\n":
        out.write("\n")
