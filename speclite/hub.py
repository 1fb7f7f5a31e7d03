"""MODEL -> local directory: an alias from models.toml, an `org/name` hub repo id, or a local dir."""

from __future__ import annotations

import contextlib
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from speclite.errors import SpecliteError

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_MODELS_FILE = PACKAGE_DIR / "models.toml"
MODELS_FILE_ENV = "SPECLITE_MODELS_FILE"

# Only what a runtime needs: weights, config, tokenizer, generation config, chat template.
ALLOW_PATTERNS = ["*.safetensors", "*.safetensors.index.json", "*.json", "*.model", "*.txt", "*.jinja"]


@dataclass(frozen=True)
class Alias:
    name: str
    repo: str | None  # hub repo id
    path: Path | None  # a directory shipped with the package (or given by the user's file)
    draft: str | None  # recommended draft model: vanilla's, and the default of methods that load one
    drafts: dict[str, str]  # method -> its own recommended draft (an EAGLE-3 head, a DFlash drafter, ...)


@dataclass(frozen=True)
class Registry:
    aliases: dict[str, Alias]
    default_target: str | None
    default_draft: str | None


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise SpecliteError(f"models file not found: {path}") from None
    except OSError as e:  # a directory, unreadable
        raise SpecliteError(f"cannot read models file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecliteError(f"models file {path} is not valid TOML: {e}") from None


def _method_drafts(file: Path, name: str, drafts) -> dict[str, str]:
    """An alias's `drafts = { METHOD = DRAFT, ... }`, checked against the registered methods."""
    from speclite.speculate.registry import METHODS, NONE, normalize_method

    where = f"models file {file}: alias '{name}'"
    if not isinstance(drafts, dict):
        raise SpecliteError(f"{where}: 'drafts' must be a table of method = draft, e.g. drafts = {{ eagle3 = \"HEAD\" }}")
    checked = {}
    for method, draft in drafts.items():
        try:
            key = normalize_method(method)
        except SpecliteError:
            raise SpecliteError(f"{where}: drafts.{method}: unknown speculation method "
                                f"(choose from {', '.join(METHODS)})") from None
        if key == NONE or not METHODS[key].takes_draft:
            raise SpecliteError(f"{where}: drafts.{method}: --sp-type {key} takes no draft")
        if not isinstance(draft, str) or not draft:
            raise SpecliteError(f"{where}: drafts.{method} must name a draft (an alias or a directory), got {draft!r}")
        checked[key] = draft
    return checked


def load_registry(models_file: str | os.PathLike | None = None) -> Registry:
    """The packaged aliases, overlaid by the user's file (--models-file or $SPECLITE_MODELS_FILE)."""
    files = [DEFAULT_MODELS_FILE]
    user_file = models_file or os.environ.get(MODELS_FILE_ENV)
    if user_file is not None and not isinstance(user_file, (str, os.PathLike)):
        raise SpecliteError(f"models_file must be a path, got {user_file!r}")
    if user_file:
        files.append(Path(user_file))
    aliases: dict[str, Alias] = {}
    defaults: dict = {}
    for file in files:
        data = _read_toml(file)
        for table in ("defaults", "models"):
            if not isinstance(data.get(table, {}), dict):
                raise SpecliteError(f"models file {file}: '{table}' must be a table ([{table}]), "
                                    f"not {type(data[table]).__name__}")
        defaults.update(data.get("defaults", {}))
        for name, entry in data.get("models", {}).items():
            if not isinstance(entry, dict) or not (entry.get("repo") or entry.get("path")):
                raise SpecliteError(f"models file {file}: alias '{name}' needs a 'repo' or a 'path'")
            for key in ("repo", "path", "draft"):
                if entry.get(key) is not None and not isinstance(entry[key], str):
                    raise SpecliteError(f"models file {file}: alias '{name}': '{key}' must be a string")
            path = entry.get("path")
            aliases[name] = Alias(
                name=name,
                repo=entry.get("repo"),
                path=(file.parent / path).resolve() if path else None,
                draft=entry.get("draft"),
                drafts=_method_drafts(file, name, entry.get("drafts", {})),
            )
    for key in ("target", "draft"):
        if defaults.get(key) is not None and not isinstance(defaults[key], str):
            raise SpecliteError(f"models file: defaults.{key} must be a string (an alias, repo id or directory)")
    return Registry(aliases, defaults.get("target"), defaults.get("draft"))


def _cached_snapshot(repo: str) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, allow_patterns=ALLOW_PATTERNS, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def is_cached(alias: Alias) -> bool:
    if alias.path is not None:
        return alias.path.is_dir()
    return _cached_snapshot(alias.repo) is not None


@contextlib.contextmanager
def _hub_errors(what: str, repo: str, offline: str):
    """huggingface_hub's failures as one line about `what` (from `repo`); `offline` says the way out
    when the hub cannot be reached."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        yield
    except LocalEntryNotFoundError:  # (an EntryNotFoundError: first)
        raise SpecliteError(f"{what} is not cached and the hub cannot be reached: {offline}") from None
    except GatedRepoError:  # (a RepositoryNotFoundError: first)
        raise SpecliteError(f"{what} is gated: accept its license on the hub and log in") from None
    except RepositoryNotFoundError:
        raise SpecliteError(f"{what}: no such repository on the hub ({repo})") from None
    except EntryNotFoundError:
        raise SpecliteError(f"{what}: no such file in {repo}") from None
    except HfHubHTTPError as e:
        raise SpecliteError(f"{what}: download failed: {e}") from None


def download(repo: str, label: str | None = None) -> Path:
    """Fetch a repo's runtime files with huggingface_hub (which draws its own progress bars)."""
    from huggingface_hub import snapshot_download

    name = label or repo
    with _hub_errors(f"model '{name}' ({repo})", repo,
                     "connect to the network and run the command again, or pass a local model directory"):
        return Path(snapshot_download(repo, allow_patterns=ALLOW_PATTERNS))


def fetch_file(repo: str, filename: str) -> Path:
    """One file of a hub repo (a token map FR-Spec publishes beside its heads): the cached copy, else
    downloaded with huggingface_hub."""
    from huggingface_hub import snapshot_download

    # A snapshot of the one file, not hf_hub_download: offline, that retried for ~25 s before failing
    # (a mistyped local path of three parts reads as ORG/NAME/FILE).
    what = f"'{repo}/{filename}'"
    with _hub_errors(what, repo, "connect to the network, or pass a local file"):
        path = Path(snapshot_download(repo, allow_patterns=[filename])) / filename
    if not path.is_file():
        raise SpecliteError(f"{what}: no such file in {repo}")
    return path


def is_repo_id(text: str) -> bool:
    """org/name as the hub takes it: letters, digits, '_', '-' and '.', neither part starting or ending
    with '-' or '.' nor holding '--' or '..', 96 characters at most each (its own rule; "mymodel/" and
    "./mymodel" are not)."""
    parts = text.split("/")
    return len(parts) == 2 and all(
        re.fullmatch(r"[\w.-]{1,96}", p, re.ASCII) and p[0] not in ".-" and p[-1] not in ".-" and ".." not in p
        and "--" not in p for p in parts)


def resolve(model: str | os.PathLike, models_file: str | os.PathLike | None = None, fetch: bool = True) -> Path:
    """A local model directory for MODEL; downloads a hub model that is not cached when fetch is set."""
    text = str(model)
    if not text.strip():
        raise SpecliteError("the model name is empty: name an alias, an org/name repo id or a directory")
    local = Path(text).expanduser()
    if local.is_dir():
        if not (local / "config.json").exists():
            raise SpecliteError(f"{local} is not a model directory: no config.json")
        return local.resolve()
    if text.startswith((".", "/", "~")):
        raise SpecliteError(f"model directory not found: {local}")
    registry = load_registry(models_file)
    alias = registry.aliases.get(text)
    if alias is not None and alias.path is not None:
        if not alias.path.is_dir():
            raise SpecliteError(f"model '{text}': its directory {alias.path} is missing")
        return alias.path
    repo = alias.repo if alias is not None else text
    if alias is None and not is_repo_id(text):
        known = ", ".join(sorted(registry.aliases))
        raise SpecliteError(f"unknown model '{text}': not a directory, an alias ({known}) or an org/name repo id")
    cached = _cached_snapshot(repo)
    if cached is not None:
        return cached
    if not fetch:
        raise SpecliteError(f"model '{text}' ({repo}) is not cached: run `speclite pull {text}`")
    return download(repo, label=text)


def recommended_draft(model: str, models_file: str | os.PathLike | None = None, method: str | None = None) -> str | None:
    """The draft models.toml recommends for MODEL (by alias, or by the alias whose repo/path it names)
    and METHOD: the method's own (`drafts`), else `draft` where the method always loads a draft model
    (vanilla, pard), else None. Without METHOD: `draft`."""
    registry = load_registry(models_file)
    alias = registry.aliases.get(str(model))
    if alias is None:
        target = Path(str(model)).expanduser()
        for candidate in registry.aliases.values():
            if candidate.repo == str(model) or (candidate.path is not None and target.is_dir() and candidate.path == target.resolve()):
                alias = candidate
                break
    if alias is None:
        return None
    if method is None:
        return alias.draft
    from speclite.speculate.registry import METHODS, normalize_method

    m = METHODS.get(normalize_method(method))
    if m is None:  # plain decoding
        return None
    if m.name in alias.drafts:
        return alias.drafts[m.name]
    # A head or drafter method (draft_is_model False) cannot run on a draft model; one that decides
    # per configuration (hybrid: a model, a head or the target's MTP) is recommended only its own.
    return alias.draft if m.takes_draft and m.draft_is_model is True else None
