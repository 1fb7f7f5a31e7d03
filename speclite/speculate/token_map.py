"""--token-map: a drafter's head over the most frequent tokens only (FR-Spec, arXiv 2502.14856).

A drafter's lm_head over a whole vocabulary is often most of its work: Qwen2.5-0.5B's 151936 x 896
head is 38% of that draft model's products, an MTP module or a DFlash drafter reads the target's
whole head (272 MB in bf16 at that shape) for every draft. Token frequencies are long-tailed, so a
head of the few thousand most frequent tokens proposes nearly the same drafts at a fraction of the
cost. It stays lossless: the target still verifies every draft, greedy output is plain decoding's,
and a sampled draft comes from the restricted head's distribution (zero outside the map), which
rejection sampling accepts like any proposal distribution.

The map is a list of token ids, the format FR-Spec publishes (`freq_32768.pt`: a torch-saved list,
loaded with weights_only) and SGLang reads (`--speculative-token-map`), or a JSON list;
`speclite token-map` counts one from a corpus. Methods whose drafter has a head of its own or
reads the target's take it: vanilla, pard, eagle3 (the map meets its draft vocabulary), mtp, medusa,
dflash, and hybrid's model part.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from speclite import files, hub
from speclite.errors import SpecliteError
from speclite.model.decoder import Linear
from speclite.model.loader import read_tensors
from speclite.quant.quantize import quantized_linear
from speclite.quant.schemes import LOAD_TIME_SCHEMES, normalize_scheme
from speclite.speculate.registry import Option

TOKEN_MAP = Option("token_map", str, None, "FR-Spec: the drafter's head computes only these tokens' logits (a .pt "
                   "list of ids as FR-Spec publishes, or a JSON list; `speclite token-map` counts one). Lossless.")


def load(path: str | Path, vocab: int) -> torch.Tensor:
    """The map's token ids (int64, ascending, each once), each checked to be a token of `vocab`."""
    path = Path(path)
    if not path.is_file():
        raise SpecliteError(f"token map {path} does not exist")
    try:
        if path.suffix == ".json":
            ids = json.loads(path.read_text())
        else:
            ids = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same one-line error
        # (torch's own text for a file that is no torch.save output suggests weights_only=False: not here)
        first = str(e).splitlines()[0] if str(e) else ""
        why = f"{type(e).__name__}: {first}" if path.suffix == ".json" else "not a torch.save of a list"
        raise SpecliteError(f"token map {path} is not a readable .pt or .json list of token ids ({why})") from None
    if isinstance(ids, torch.Tensor):
        ids = ids.flatten().tolist() if not ids.is_floating_point() else None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise SpecliteError(f"token map {path} must hold a non-empty list of integer token ids")
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise SpecliteError(f"token map {path} names token {bad}, outside the target's vocabulary of {vocab}")
    return torch.tensor(sorted(set(ids)), dtype=torch.int64)


def restrict(head: nn.Module, head_tokens: torch.Tensor | None, keep: torch.Tensor, what: str
             ) -> tuple[Linear, torch.Tensor]:
    """(a head of the rows of `head` whose token is in `keep`, those rows' tokens). head_tokens: each
    row's token (None: row i is token i)."""
    if type(head) is not Linear:
        raise SpecliteError(f"--token-map restricts a dense head: {what}'s is a {type(head).__name__} "
                            "(quantized); leave the head unquantized")
    tokens = torch.arange(head.out_features) if head_tokens is None else head_tokens.cpu()
    rows = torch.isin(tokens, keep).nonzero().flatten()
    if rows.numel() == 0:
        raise SpecliteError(f"--token-map: no token of the map is in {what}'s vocabulary")
    device = head.weight.device
    return head.rows(rows.to(device)), tokens[rows].to(device)


def tokens(ctx) -> torch.Tensor | None:
    """The --token-map of a method's build context (its tokens), or None without one. A relative path
    that is not there is looked up in the target's checkpoint directory, then the draft's (a map
    shipped beside a model is named by its file name: `--token-map freq_32768.pt`), then read as
    ORG/NAME/FILE on the hub (FR-Spec's: `thunlp/LLaMA3-Instruct-8B-FR-Spec/freq_32768.pt`)."""
    given = ctx.options.get("token_map")
    if given is None:
        return None
    path = Path(given)
    if not path.is_absolute() and not path.exists():
        beside = [Path(d) / path for d in (ctx.target.checkpoint_dir, ctx.draft_dir) if d is not None]
        path = next((p for p in beside if p.is_file()), None)
        parts = given.split("/")
        if path is None and len(parts) >= 3 and not given.startswith((".", "~")):
            path = hub.fetch_file("/".join(parts[:2]), "/".join(parts[2:]))
    return load(path or given, ctx.target_vocab)


def draft_model(ctx):
    """ctx.draft, or with --token-map a view of it drafting through its head's rows of the map's tokens.
    Where --draft-quant BODY/HEAD quantized the whole head at load, the view's head is the map's rows of
    the checkpoint's dense head, quantized to HEAD alike."""
    keep = tokens(ctx)
    if keep is None:
        return ctx.draft
    head = dense_head(ctx.draft, ctx.draft_dir) if ctx.head_quant else ctx.draft.lm_head
    return ctx.draft.restricted(*drafting_head(head, None, keep, ctx.head_quant, ctx.draft.dtype, "the draft model"))


def drafting_head(head: nn.Module, head_tokens: torch.Tensor | None, keep: torch.Tensor | None, scheme: str,
                  dtype: torch.dtype, what: str) -> tuple[nn.Module, torch.Tensor | None]:
    """(the head a drafter drafts through, its rows' tokens): `head`'s rows of the map's tokens where
    `keep` (--token-map), as a copy quantized to `scheme` where one is named (HEAD of --draft-quant
    BODY/HEAD) from its weights in `dtype` (the activations'), so the same numbers as those rows of the
    whole head quantized (each row quantizes on its own). head_tokens: as restrict's, returned as they
    are without a map."""
    if keep is not None:
        head, head_tokens = restrict(head, head_tokens, keep, what)
    if scheme:
        if type(head) is not Linear:
            raise SpecliteError(f"--draft-quant BODY/{scheme} drafts through a quantized copy of {what}'s head, "
                                "which is quantized already: name the body's scheme alone")
        dense = Linear.holding(head.weight.detach().to(dtype))
        head = quantized_linear(dense, normalize_scheme(scheme, LOAD_TIME_SCHEMES))
    return head, head_tokens


def dense_head(model, model_dir: Path) -> Linear:
    """`model`'s lm_head as its checkpoint holds it (the embedding where tied), in its activations' dtype."""
    name = "model.embed_tokens.weight" if model.args.tie_word_embeddings else "lm_head.weight"
    weight = read_tensors(model_dir, lambda n: n == name).get(name)
    if weight is None:
        raise SpecliteError(f"--token-map restricts a dense head: {model_dir} holds no dense {name}")
    return Linear.holding(weight.to(model.model.norm.weight.device, model.dtype))


def count(tokenizer, texts: Iterable[str]) -> Counter:
    """How often each token id occurs in the texts, as the tokenizer splits them (no special tokens)."""
    counts: Counter = Counter()
    for text in texts:
        counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return counts


def most_frequent(counts: Counter, size: int, always: Iterable[int] = ()) -> list[int]:
    """The `size` most frequent ids (ties: the smaller id first), `always` (special tokens such as
    EOS, which a drafter must be able to propose) among them."""
    chosen = dict.fromkeys(always)  # ordered, and a set for the test below
    for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if len(chosen) >= size:
            break
        chosen.setdefault(token)
    return list(chosen)[:size]


def corpus_texts(paths: Iterable[Path]) -> Iterable[str]:
    """Texts of a corpus: a .jsonl file's records' "text" (else "prompt") fields, any other file whole,
    a directory's files (recursively, in name order)."""
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if file.suffix == ".jsonl":
                for n, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:
                        raise SpecliteError(f"{file}:{n}: not a JSON record") from None
                    text = record.get("text", record.get("prompt")) if isinstance(record, dict) else None
                    if not isinstance(text, str):
                        raise SpecliteError(f"{file}:{n}: a record needs a \"text\" or \"prompt\" string")
                    yield text
            else:
                yield file.read_text(encoding="utf-8", errors="replace")


def check_writable(path: Path) -> None:
    """Before the corpus is counted (minutes on a large one): OUT can be written, its folder made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecliteError(f"cannot write --output {path}: {e.strerror or e}") from None
    files.check_writable(path, "--output")


def save(ids: list[int], path: Path) -> None:
    """FR-Spec's format: a torch-saved list of ids (.json: a JSON list), written atomically (its folder
    made)."""
    if path.suffix == ".json":
        data = json.dumps(ids).encode()
    else:
        buffer = io.BytesIO()
        torch.save(ids, buffer)
        data = buffer.getvalue()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(path, data)
    except OSError as e:
        raise SpecliteError(f"cannot write --output {path}: {e.strerror or e}") from None
