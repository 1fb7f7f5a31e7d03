"""Train speclite's embedded model pair (tiny-code + tiny-code-draft) on the CPU.

The corpus is the Python standard library of the interpreter running this script (PSF
license, present on every machine), so the assets can be rebuilt anywhere without a network.
Both models are Qwen2-architecture transformers models sharing one byte-level BPE tokenizer;
the draft is distilled from the target so its greedy guesses agree with it like a real draft.

    nice -n 10 python scripts/train_tiny.py --out-dir speclite/assets
"""

import argparse
import ast
import hashlib
import math
import random
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2Config,
                          Qwen2ForCausalLM, PreTrainedTokenizerFast)

EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
TEST_DIRS = {"test", "tests", "idle_test"}


# ---------------------------------------------------------------- corpus

def stdlib_files():
    """Sorted stdlib .py files, minus tests and site-packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if "site-packages" in rel.parts or TEST_DIRS & set(rel.parts[:-1]):
            continue
        if rel.name.startswith("test_"):
            continue
        files.append((rel.as_posix(), path))
    return files


def is_heldout(rel, percent):
    # Hashing the path (not shuffling) keeps the split stable across machines and runs.
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 100 < percent


def chat_examples(source):
    """ChatML conversations 'write function X: <docstring>' -> its code, so chat works too."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        code = ast.get_source_segment(source, node, padded=True)
        if not doc or not code or len(code) > 1500:
            continue
        ask = doc.strip().split("\n\n")[0].replace("\n", " ")
        out.append(f"{IM_START}user\nWrite a Python function `{node.name}`: {ask}{IM_END}\n"
                   f"{IM_START}assistant\n{textwrap.dedent(code)}{IM_END}\n")
    return out


def load_corpus(heldout_percent):
    """(train_docs, heldout_docs): raw files plus chat examples drawn from the same files."""
    train, heldout = [], []
    for rel, path in stdlib_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        docs = [text] + chat_examples(text)
        (heldout if is_heldout(rel, heldout_percent) else train).extend(docs)
    return train, heldout


def heldout_prompts(percent, limit=48):
    """Code-completion prompts from held-out files: the lines before a function, up to its `def`.

    Written next to the models so tests and benchmarks measure acceptance on unseen code.
    """
    prompts = []
    for rel, path in stdlib_files():
        if not is_heldout(rel, percent):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (UnicodeDecodeError, OSError, SyntaxError, ValueError):
            continue
        lines = source.splitlines(keepends=True)
        # Top-level functions whose body starts on a later line than the `def`.
        funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.body[0].lineno > n.lineno][:2]
        for node in funcs:
            body_start = node.body[0].lineno - 1  # keep the def line(s), stop before the body
            prompt = "".join(lines[max(0, node.lineno - 13):body_start])
            if 40 <= len(prompt) <= 1200:
                prompts.append({"id": f"{rel}:{node.name}", "prompt": prompt})
    return prompts[:limit]


def write_heldout_prompts(out, percent):
    import json

    rows = heldout_prompts(percent)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "heldout_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} held-out prompts -> {Path(out) / 'heldout_prompts.jsonl'}")


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(docs, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, chat_template=CHAT_TEMPLATE, eos_token=IM_END, pad_token=EOT,
        additional_special_tokens=[IM_START], clean_up_tokenization_spaces=False)


def token_stream(tokenizer, docs, seed):
    """All docs in a seeded order, each followed by <|endoftext|>, as one int64 tensor."""
    docs = list(docs)
    random.Random(seed).shuffle(docs)
    ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
    eot = tokenizer.convert_tokens_to_ids(EOT)
    return torch.tensor([t for doc in ids for t in doc + [eot]], dtype=torch.long)


# ---------------------------------------------------------------- models

def make_model(tokenizer, hidden, layers, heads, kv_heads, intermediate, max_positions):
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None)
    return Qwen2ForCausalLM(config)


def batches(stream, batch_size, seq_len, rng):
    """Endless random (seq_len + 1)-token windows: inputs and shifted labels come from one."""
    while True:
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=rng)
        yield torch.stack([stream[s:s + seq_len + 1] for s in starts])


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(target, draft, stream, args):
    """Train both models on the same batches with AdamW + warmup/cosine.

    The draft learns online from the target: its loss mixes data CE with KL to the target's
    (detached) logits of the same step, which costs no extra target forward pass and makes the
    draft imitate the target rather than merely model the data like it.
    """
    params = list(target.parameters()) + list(draft.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = torch.Generator().manual_seed(args.seed)
    target.train()
    draft.train()
    start = time.time()
    for step, window in zip(range(args.steps), batches(stream, args.batch_size, args.seq_len, rng)):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        inputs, labels = window[:, :-1], window[:, 1:].flatten()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            t_logits = target(input_ids=inputs).logits.float().flatten(0, 1)
            d_logits = draft(input_ids=inputs).logits.float().flatten(0, 1)
        t_loss = F.cross_entropy(t_logits, labels)
        d_ce = F.cross_entropy(d_logits, labels)
        kl = F.kl_div(d_logits.log_softmax(-1), t_logits.detach().log_softmax(-1),
                      log_target=True, reduction="batchmean")
        d_loss = (1 - args.distill_weight) * d_ce + args.distill_weight * kl
        (t_loss + d_loss).backward()
        for model in (target, draft):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"step {step}/{args.steps} target CE {t_loss.item():.3f} draft CE "
                  f"{d_ce.item():.3f} KL {kl.item():.3f} {time.time() - start:.0f}s", flush=True)
    target.eval()
    draft.eval()


@torch.no_grad()
def evaluate(target, draft, stream, args):
    """Held-out loss of both models and the draft's teacher-forced greedy agreement."""
    n = min(args.eval_windows, (len(stream) - 1) // args.seq_len)
    losses, agree, total = {"target": 0.0, "draft": 0.0}, 0, 0
    for i in range(0, n, args.batch_size):
        window = torch.stack([stream[j * args.seq_len:(j + 1) * args.seq_len + 1]
                              for j in range(i, min(n, i + args.batch_size))])
        inputs, labels = window[:, :-1], window[:, 1:]
        preds = {}
        for name, model in (("target", target), ("draft", draft)):
            logits = model(input_ids=inputs).logits.float()
            losses[name] += F.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                            reduction="sum").item()
            preds[name] = logits.argmax(-1)
        agree += (preds["target"] == preds["draft"]).sum().item()
        total += labels.numel()
    return {"tokens": total, "agreement": agree / total,
            **{f"{k}_loss": v / total for k, v in losses.items()}}


# ---------------------------------------------------------------- saving

def save(model, tokenizer, out_dir):
    model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.generation_config = GenerationConfig(
        # <|im_end|> ends a chat turn, <|endoftext|> a plain completion (Qwen2.5's convention).
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id, do_sample=False)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def sample_text(model, tokenizer, prompt, max_new_tokens):
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=max_new_tokens)
    return tokenizer.decode(out[0], skip_special_tokens=True)


def count_params(model):
    return sum(p.numel() for p in model.parameters())  # tied lm_head counted once


def dir_mb(path):
    return sum(f.stat().st_size for f in Path(path).iterdir()) / 1e6


def write_card(path, args, stats, sizes, params, sample, wall, n_train, n_heldout):
    ppl = {k: math.exp(stats[f"{k}_loss"]) for k in ("target", "draft")}
    command = "python " + " ".join(a for a in sys.argv if a)
    Path(path).write_text(f"""# Embedded models: tiny-code and tiny-code-draft

A target/draft pair small enough to ship inside the package, so that speclite runs offline and
its tests see acceptance rates of real trained models. Toys, not useful assistants.

- Architecture: Qwen2 (transformers `Qwen2ForCausalLM`), tied embeddings, bf16 safetensors.
  - `tiny-code`: {params['target'] / 1e6:.2f}M parameters, hidden {args.hidden}, \
{args.layers} layers, {args.heads} heads ({args.kv_heads} KV), {sizes['target']:.1f} MB.
  - `tiny-code-draft`: {params['draft'] / 1e6:.2f}M parameters, hidden {args.draft_hidden}, \
{args.draft_layers} layers, {args.draft_heads} heads ({args.draft_kv_heads} KV), \
{sizes['draft']:.1f} MB.
- Tokenizer (shared): byte-level BPE, {args.vocab_size} tokens, ChatML template
  (`<|im_start|>role\\n...<|im_end|>\\n`); eos `<|im_end|>` (chat) and `<|endoftext|>` (text).
- Data: the Python {sys.version.split()[0]} standard library sources (PSF license), tests and
  site-packages excluded, plus ChatML examples "Write a Python function `name`: <docstring>" ->
  that function's code, drawn from the same files. {n_heldout} of {n_train + n_heldout}
  documents (files whose path hashes into {args.heldout_percent}%) are held out.
- Training: both from scratch, {args.steps} steps on the same batches; the draft's loss is
  {1 - args.distill_weight:g} * CE + {args.distill_weight:g} * KL(target || draft) against the
  target's logits of the same step (online distillation). AdamW, warmup + cosine, batch {args.batch_size} x {args.seq_len} tokens, CPU, seed {args.seed}.
  Wall time {wall / 60:.0f} min.

Limits: {args.steps * args.batch_size * args.seq_len // 1000}k training tokens on a shared 2-core CPU, so both models are far from
converged (greedy text loops on Python fragments such as `self.`, not code), and they were trained on
{args.seq_len}-token windows though the config allows {args.max_positions}. More `--steps` gives better models.

Held-out ({stats['tokens']} tokens, teacher forcing):

| model | loss | perplexity |
|---|---|---|
| tiny-code | {stats['target_loss']:.3f} | {ppl['target']:.2f} |
| tiny-code-draft | {stats['draft_loss']:.3f} | {ppl['draft']:.2f} |

Draft's greedy next token equals the target's on **{stats['agreement']:.1%}** of held-out
positions.

Reproduce: `{command}`

Greedy sample from `tiny-code`:

```python
{sample}
```
""")


# ---------------------------------------------------------------- main

def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="speclite/assets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--heldout-percent", type=int, default=5)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--distill-weight", type=float, default=0.7,
                   help="share of the draft's loss that is KL to the target")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--max-positions", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--draft-hidden", type=int, default=128)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--draft-heads", type=int, default=4)
    p.add_argument("--draft-kv-heads", type=int, default=2)
    p.add_argument("--draft-intermediate", type=int, default=384)
    p.add_argument("--eval-windows", type=int, default=128)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--bf16", action="store_true",
                   help="bf16 autocast (measured slower than float32 on a 2-core CPU)")
    p.add_argument("--prompts-only", action="store_true",
                   help="only (re)write heldout_prompts.jsonl into --out-dir")
    p.add_argument("--sample-prompt", default="def fibonacci(n):\n")
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    began = time.time()
    out = Path(args.out_dir)
    if args.prompts_only:
        write_heldout_prompts(out, args.heldout_percent)
        return

    train_docs, heldout_docs = load_corpus(args.heldout_percent)
    tokenizer = train_tokenizer(train_docs, args.vocab_size)
    train_stream = token_stream(tokenizer, train_docs, args.seed)
    heldout_stream = token_stream(tokenizer, heldout_docs, args.seed)
    print(f"{len(train_docs)} train docs ({len(train_stream)} tokens), {len(heldout_docs)} "
          f"held-out docs ({len(heldout_stream)} tokens); {time.time() - began:.0f}s", flush=True)

    target = make_model(tokenizer, args.hidden, args.layers, args.heads, args.kv_heads,
                        args.intermediate, args.max_positions)
    draft = make_model(tokenizer, args.draft_hidden, args.draft_layers, args.draft_heads,
                       args.draft_kv_heads, args.draft_intermediate, args.max_positions)
    params = {"target": count_params(target), "draft": count_params(draft)}
    print(f"params: {params}", flush=True)

    train(target, draft, train_stream, args)

    dirs = {"target": out / "tiny-code", "draft": out / "tiny-code-draft"}
    for name, model in (("target", target), ("draft", draft)):
        save(model, tokenizer, dirs[name])
    # Measure what ships: the bf16 weights as reloaded from disk.
    target, draft = (AutoModelForCausalLM.from_pretrained(dirs[k], dtype=torch.float32)
                     for k in ("target", "draft"))
    stats = evaluate(target, draft, heldout_stream, args)
    print(stats, flush=True)
    sample = sample_text(target, AutoTokenizer.from_pretrained(dirs["target"]),
                         args.sample_prompt, 80)
    print(sample, flush=True)
    sizes = {k: dir_mb(d) for k, d in dirs.items()}
    write_card(out / "README.md", args, stats, sizes, params, sample, time.time() - began,
               len(train_docs), len(heldout_docs))
    write_heldout_prompts(out, args.heldout_percent)
    print(f"done in {time.time() - began:.0f}s; sizes MB {sizes}", flush=True)


if __name__ == "__main__":
    main()
