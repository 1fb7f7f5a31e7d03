"""Batch generation from JSONL: every result appended and flushed as it finishes, resumable by id."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from speclite.sampling import SamplingParams
from speclite.engine.stats import RequestStats
from speclite.errors import SpecliteError
from speclite.files import write_atomic
from speclite.request import GenerationRequest, check_id, parse_request


@dataclass
class Job:
    key: str  # json of the id: how finished records are recognised on a re-run
    record: dict  # "id" or "line": what the output line is keyed by
    line: int
    request: GenerationRequest | None = None
    error: str | None = None


@dataclass
class BatchSummary:
    total: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0
    stats: RequestStats = field(default_factory=RequestStats)


def check_output_writable(path: Path, input_path: Path | None = None) -> None:
    """The output can take appended records: a regular file or none yet, not the input itself (the
    results would be read back as requests)."""
    if path.exists() and not path.is_file():  # /dev/stdout, a FIFO, a directory: resume reads it back
        raise SpecliteError(f"the output {path} is not a regular file: name a .jsonl file")
    if input_path is not None and path.exists() and input_path.exists() and path.samefile(input_path):
        raise SpecliteError(f"the output {path} is the input file: name another file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a"):
            pass
    except OSError as e:
        folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
        why = f"{folder} is a file, not a folder" if folder is not None and not folder.is_dir() else e.strerror
        raise SpecliteError(f"cannot write the output file {path}: {why}") from None


def _key(line: bytes) -> tuple[str | None, bool]:
    """(the key of an output line's record, whether it is an error record); None for a line that is no
    record (cut short by a crash: that request runs again)."""
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None, False
    if isinstance(rec, dict) and "id" in rec:
        return json.dumps(rec["id"]), "error" in rec
    if isinstance(rec, dict) and "line" in rec:
        return f"line:{rec['line']}", "error" in rec
    return None, False


def finished_keys(path: Path) -> tuple[set[str], set[str]]:
    """(keys of the results already in the output, keys of its error records)."""
    results: set[str] = set()
    errors: set[str] = set()
    if path.exists():
        for line in path.read_bytes().splitlines():
            key, error = _key(line)
            if key is not None:
                (errors if error else results).add(key)
    return results, errors - results


def drop_errors(path: Path, keys: set[str]) -> None:
    """The output without the error records of `keys` (their lines run again), written atomically: a
    crash leaves the old file or the new one, never a mix."""
    kept = []
    for line in path.read_bytes().splitlines(keepends=True):
        key, error = _key(line)
        if not (error and key in keys):
            kept.append(line)
    write_atomic(path, b"".join(kept))


def parse_jobs(path: Path, defaults: SamplingParams) -> list[Job]:
    """One job a non-blank line; a line that cannot run is an error job (its record says why). An id
    seen on an earlier line makes an error job too, keyed by its line: resuming finds records by id,
    so a repeated one would be taken for done."""
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        raise SpecliteError(f"input file not found: {path}") from None
    except OSError as e:
        raise SpecliteError(f"cannot read the input file {path}: {e.strerror}") from None
    jobs, first_line = [], {}
    for number, line in enumerate(lines, start=1):
        if line.strip():
            job = _parse(number, line, defaults)
            if job.key in first_line:
                whose = "its line number (it has no id)" if job.request and job.request.id is None else "its id"
                job = Job(f"line:{number}", {"line": number}, number,
                          error=f"line {number}: {whose} {job.key} is line {first_line[job.key]}'s id already: "
                                "ids must be unique (a re-run skips the ids it finds done)")
            first_line.setdefault(job.key, number)
            jobs.append(job)
    return jobs


def _parse(number: int, raw: bytes, defaults: SamplingParams) -> Job:
    where = f"line {number}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return Job(f"line:{number}", {"line": number}, number, error=f"{where} is not valid UTF-8: {e.reason}")
    if number == 1:
        line = line.removeprefix("\ufeff")  # a byte order mark, as some editors begin UTF-8 files
    try:
        data = json.loads(line)
    except (ValueError, RecursionError) as e:  # also numbers of over 4300 digits, nesting past the stack
        why = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply" if isinstance(e, RecursionError) else e
        return Job(f"line:{number}", {"line": number}, number, error=f"{where} is not valid JSON: {why}")
    try:
        request = parse_request(data, defaults, where)
    except SpecliteError as e:
        return _bad(number, data, str(e))
    record_id = number if request.id is None else request.id
    return Job(json.dumps(record_id), {"id": record_id}, number, request)


def _bad(number: int, data: object, message: str) -> Job:
    """An error job, keyed by the line's id when that id is itself valid, else by the line number."""
    if isinstance(data, dict) and "id" in data:
        try:
            check_id(data["id"])
            return Job(json.dumps(data["id"]), {"id": data["id"]}, number, error=message)
        except SpecliteError:
            pass
    return Job(f"line:{number}", {"line": number}, number, error=message)


def run_batch(
    llm,
    jobs: list[Job],
    output_path: Path,
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[dict], None] | None = None,
) -> BatchSummary:
    """Generate every job not yet recorded in output_path, appending and fsyncing each result.

    A failed write (disk full, the file removed) stops the run with one line; the output then
    holds only whole records, so running the same command again finishes the rest.
    """
    check_output_writable(output_path)
    done, failed = finished_keys(output_path)
    summary = BatchSummary(total=len(jobs))
    pending = [j for j in jobs if j.key not in done]
    # A line fixed since (or a longer context) may run now: its error record goes, keyed by its id or,
    # where its id could not be read then, by its line.
    retried = failed & ({j.key for j in pending} | {f"line:{j.line}" for j in pending})
    if retried:
        try:
            drop_errors(output_path, retried)
        except OSError as e:
            raise SpecliteError(f"cannot rewrite the output file {output_path}: {e.strerror}") from None
    summary.skipped = len(jobs) - len(pending)
    if on_start:
        on_start(len(pending))
    with ResultWriter(output_path) as out:
        for job in pending:
            record, stats = dict(job.record), None
            if job.error is None:
                fields, stats = _generate(llm, job)
                record.update(fields)
            else:
                record["error"] = job.error
            try:
                out.append(record)
            except OSError as e:
                saved = summary.skipped + summary.done + summary.failed
                kept = "none of this run's results are" if e.errno == errno.ENOENT else f"{saved} of {len(jobs)} results are"
                raise SpecliteError(
                    f"cannot write to {output_path} ({e.strerror}): stopped; {kept} safely in it, with no partial "
                    "record; free space (or restore the path) and run the same command again to finish"
                ) from None
            summary.failed += "error" in record
            summary.done += "error" not in record
            if stats is not None:
                summary.stats.merge(stats)
            if on_result:
                on_result(record)
    return summary


def _generate(llm, job: Job) -> tuple[dict, RequestStats | None]:
    """The result fields of one request, or an error naming its line."""
    request = job.request
    try:
        result = llm.generate(request.prompt, request.params, request.extra_config)[0]
    except SpecliteError as e:
        return {"error": f"line {job.line}: {e}"}, None
    except torch.OutOfMemoryError:
        return {"error": f"line {job.line}: out of memory: try a shorter max_new_tokens or --quant int4"}, None
    fields = dict(text=result.text, token_ids=result.token_ids, finish_reason=result.finish_reason,
                  aux_info=result.aux_info)
    return fields, result.stats


class ResultWriter:
    """Appends whole JSONL records: each is written, fsynced, or cut back off the file on failure."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> "ResultWriter":
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            self._drop_cut_last_line()
        except OSError as e:
            raise SpecliteError(f"cannot write the output file {self.path}: {e.strerror}") from None
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def append(self, record: dict) -> None:
        """Write and fsync one record; on an OSError the file is cut back to where it was."""
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        start = os.fstat(self.fd).st_size
        try:
            if not os.path.exists(self.path) or not os.path.samestat(os.stat(self.path), os.fstat(self.fd)):
                raise FileNotFoundError(2, "the file was removed or replaced during the run")
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]
            os.fsync(self.fd)
        except OSError:
            try:
                os.ftruncate(self.fd, start)  # no partial record: the file stays valid JSONL
            except OSError:
                pass
            raise

    def _drop_cut_last_line(self) -> None:
        """A crash (kill -9) may have cut the last record short: drop it, so its request runs again."""
        size = os.fstat(self.fd).st_size
        content = os.pread(self.fd, size, 0)
        last = content.rfind(b"\n") + 1
        if last == size:
            return
        try:
            json.loads(content[last:])
            os.write(self.fd, b"\n")  # a whole record that only lacks its newline
        except ValueError:
            os.ftruncate(self.fd, last)
