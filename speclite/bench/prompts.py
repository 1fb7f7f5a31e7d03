"""Built-in benchmark prompts, grouped by the workload the speculation methods differ on.

Short on purpose (they must fit tiny models' contexts and CI time) and written for speclite.
Prompt lookup shines where the answer copies the input (summaries, edits), a draft model where
the continuation is predictable text (code, JSON); free chat is the hard case for both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from speclite.request import SAMPLING_FIELDS, parse_request
from speclite.errors import SpecliteError


@dataclass(frozen=True)
class BenchPrompt:
    name: str
    workload: str
    prompt: str | list[dict]  # raw text, or chat messages
    extra: dict = field(default_factory=dict)  # extra_config: sp_advice_prompt, sp_edit


_ARTICLE = (
    "The city library will extend its opening hours from the first of March. On weekdays it will "
    "open at eight in the morning and close at nine in the evening; on Saturdays it will open at "
    "ten and close at six. The reading room on the second floor will stay open until midnight "
    "during the exam weeks in June. The library asks visitors to return borrowed laptops to the "
    "front desk, not to the book drop."
)
_NOTES = (
    "Release 2.4 fixes the crash when a config file is empty, makes the cache directory "
    "configurable with CACHE_DIR, and drops support for Python 3.8. Upgrading needs no "
    "migration; the old cache is reused."
)
_EDIT_SRC = (
    "def mean(values):\n"
    "    total = 0\n"
    "    for v in values:\n"
    "        total += v\n"
    "    return total / len(values)\n"
)
_EDIT_NEW = (
    "def mean(values):\n"
    "    if not values:\n"
    "        return 0.0\n"
    "    total = 0\n"
    "    for v in values:\n"
    "        total += v\n"
    "    return total / len(values)\n"
)
_EDIT2_SRC = (
    "class Counter:\n"
    "    def __init__(self):\n"
    "        self.count = 0\n"
    "\n"
    "    def add(self):\n"
    "        self.count += 1\n"
)
_EDIT2_NEW = (
    "class Counter:\n"
    "    def __init__(self, start=0):\n"
    "        self.count = start\n"
    "\n"
    "    def add(self, n=1):\n"
    "        self.count += n\n"
)
_EDIT3_SRC = '{"name": "speclite", "version": "0.1.0", "debug": true}\n'
_EDIT3_NEW = '{"name": "speclite", "version": "0.2.0", "debug": false}\n'


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# `repeat`: an agent loop over similar records and a code edit applied to look-alike functions;
# each answer mostly repeats an earlier one, the case suffix decoding learns from (run in order).
_AGENT = ('You are a coding agent. Reply with exactly one tool call as JSON, {"tool": "read_file", '
          '"args": {"path": ...}}, then one line saying why.\nTask: ')
_HINTS = "Add type hints (int) to this function and change nothing else:\n\n"
_LOOKALIKES = {
    "add": "def add(a, b):\n    total = a + b\n    return total\n",
    "sub": "def sub(a, b):\n    total = a - b\n    return total\n",
    "mul": "def mul(a, b):\n    total = a * b\n    return total\n",
}
_REPEAT = tuple(
    [BenchPrompt(f"repeat-agent-{name}", "repeat", _user(f"{_AGENT}open src/{name}.py and list its functions"))
     for name in ("config", "models", "views", "utils")]
    + [BenchPrompt(f"repeat-edit-{name}", "repeat", _user(_HINTS + code)) for name, code in _LOOKALIKES.items()]
)


BUILTIN: tuple[BenchPrompt, ...] = (
    BenchPrompt("code-fib", "code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    BenchPrompt("code-sort", "code", "import os\nimport sys\n\n\ndef list_files(path):\n    result = []\n    for name in "),
    BenchPrompt("code-class", "code", "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"),
    BenchPrompt("json-user", "json",
                'Return the user as JSON with keys id, name, email.\nUser: id 42, name Ada Lovelace, '
                'email ada@example.com\nJSON: {"id": 42, "name": '),
    BenchPrompt("json-list", "json",
                'Convert to a JSON list of objects with "item" and "qty".\nApples 3, pears 5, plums 2.\n'
                'JSON: [{"item": "apples", "qty": 3}, '),
    BenchPrompt("json-config", "json",
                'Write the settings as JSON.\nhost localhost, port 8080, debug true, workers 4\n'
                'JSON: {"host": "localhost", '),
    BenchPrompt("sum-library", "summarise", f"Summarise the notice in two sentences.\n\n{_ARTICLE}\n\nSummary: The library"),
    BenchPrompt("sum-release", "summarise", f"Summarise the release notes.\n\n{_NOTES}\n\nSummary: Release 2.4"),
    BenchPrompt("sum-chat", "summarise", _user(f"Summarise this notice briefly:\n{_ARTICLE}")),
    BenchPrompt("edit-mean", "edit", f"Make mean() return 0.0 for an empty list.\n\n{_EDIT_SRC}\nEdited:\n",
                {"sp_advice_prompt": _EDIT_NEW, "sp_edit": 1}),
    BenchPrompt("edit-counter", "edit", f"Let Counter start at any value and add n at a time.\n\n{_EDIT2_SRC}\nEdited:\n",
                {"sp_advice_prompt": _EDIT2_NEW, "sp_edit": 1}),
    BenchPrompt("edit-json", "edit", f"Bump the version to 0.2.0 and turn debug off.\n\n{_EDIT3_SRC}\nEdited:\n",
                {"sp_advice_prompt": _EDIT3_NEW, "sp_edit": 1}),
    BenchPrompt("chat-python", "chat", _user("How do I read a file line by line in Python?")),
    BenchPrompt("chat-plan", "chat", _user("Give me three tips for writing clear commit messages.")),
    BenchPrompt("chat-explain", "chat", _user("What is a hash table, in one paragraph?")),
    *_REPEAT,
)
WORKLOADS = tuple(dict.fromkeys(p.workload for p in BUILTIN))


def select_builtin(spec: str) -> list[BenchPrompt]:
    """`builtin` (every workload) or `builtin:code,json`."""
    _, _, wanted = spec.partition(":")
    if not wanted:
        return list(BUILTIN)
    names = [w.strip() for w in wanted.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown or not names:
        raise SpecliteError(f"unknown workload '{','.join(unknown) or wanted}' in --prompts: choose from {', '.join(WORKLOADS)}")
    return [p for p in BUILTIN if p.workload in names]


def read_jsonl(path: Path) -> list[BenchPrompt]:
    """Prompts from a JSONL file: {"prompt"|"messages", optional "id", "workload", "extra_config"}."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise SpecliteError(f"cannot read --prompts file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecliteError(f"--prompts file {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecliteError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        request = parse_request(rec, where=f"{path}:{n}")  # the same request schema as `speclite generate`
        given = [key for key in SAMPLING_FIELDS if rec.get(key) is not None]
        if given:  # every configuration runs every prompt alike, with the flags' sampling
            raise SpecliteError(f"{path}:{n}: '{given[0]}' would be ignored: bench samples every prompt as its flags "
                                "say (--max-new-tokens, --temperature, ...)")
        prompts.append(BenchPrompt(str(rec.get("id", f"line{n}")), str(rec.get("workload", "file")), request.prompt,
                                   request.extra_config))
    if not prompts:
        raise SpecliteError(f"--prompts file {path} has no prompts")
    return prompts


def load_prompts(spec: str) -> list[BenchPrompt]:
    if spec == "builtin" or spec.startswith("builtin:"):
        return select_builtin(spec)
    return read_jsonl(Path(spec))
