"""Train drafting heads for the embedded `tiny-code` target on the CPU: EAGLE-3, MTP, Medusa, PARD.

The frozen target is the teacher. It is loaded by speclite itself, so the hidden states a head
learns from are exactly those speclite hands its proposer at run time, and every head learns
KL(target || head) against the target's next-token distribution at the position it guesses:
a draft is accepted when it matches the target, not the data. The data are train_tiny.py's
(the same stdlib corpus and hashed held-out split, imported, not copied).

- eagle3: one EAGLE-3 layer over the inputs of target layers 2, 4, 5, with the training-time test:
  each batch is unrolled `--steps-ahead` steps, step j feeding the head its own output states of
  step j-1 (as when it drafts a chain), attention as at run time (the target's pairs up to the
  row, then the row's own earlier steps); loss 0.8^j * KL at each step. SpecForge layout, a draft
  vocabulary of the most frequent training tokens (d2t / t2d).
- mtp: a DeepSeek-V3-layout MTP module (enorm, hnorm, eh_proj, one Qwen2 block, shared_head.norm;
  the target's lm_head) over the target's final normed state, unrolled the same way.
- medusa: Medusa heads (one residual block each) over the final normed state, through the target's
  own lm_head (vLLM layout, `original_lm_head` with no head saved: the heads are 0.5 MB, not 8.9);
  head i learns the target's distribution i + 1 tokens after the next.
- pard: tiny-code-draft adapted as a PARD parallel draft: after each real token t, up to
  `--steps-ahead` - 1 mask tokens predict tokens t + 2.. ; conditional drop-token keeps every
  anchor for the first mask and a random half of the previous depth's anchors for each next one.

`--target-text N` trains on the target's own greedy continuations instead of the corpus: N windows
of the training split cut to `--prompt-len` tokens, each continued greedily by the target to
`--seq-len` (self-distillation data, as EAGLE and Medusa-2 regenerate theirs with the target: a draft
then learns the text it will be asked to draft at run time). Held-out figures stay on the corpus.

    nice -n 10 python scripts/train_heads.py --method eagle3 --out-dir speclite/assets
"""

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout: speclite itself
sys.path.insert(0, str(Path(__file__).resolve().parent))  # train_tiny.py beside this script
from train_tiny import batches, load_corpus, lr_at, token_stream  # noqa: E402

from speclite.model.decoder import ModelArgs  # noqa: E402
from speclite.model.loader import load_model  # noqa: E402
from speclite.model.step import Tree, Wants  # noqa: E402
from speclite.speculate.eagle3.head import Eagle3Head  # noqa: E402
from speclite.speculate.eagle3.load import load_head  # noqa: E402
from speclite.speculate.eagle3.save import save_head  # noqa: E402
from speclite.speculate.medusa.save import save_heads  # noqa: E402
from speclite.speculate.medusa.head import MedusaHeads  # noqa: E402
from speclite.speculate.mtp.module import MTPModule  # noqa: E402
from speclite.speculate.mtp.save import save_module  # noqa: E402

ASSETS = Path(__file__).resolve().parents[1] / "speclite" / "assets"
EAGLE_LAYERS = (2, 4, 5)  # inputs of these target layers: low, middle, high (the last one's output is not handed out)
DATA_SEED = 0  # train_tiny.py's default --seed: its document order
STEP_DECAY = 0.8  # EAGLE-3's weight of step j's loss: 0.8 ** j


# ---------------------------------------------------------------- packing

def causal_blocks(b: int, s: int) -> torch.Tensor:
    """[b*s, b*s]: b windows packed as one sequence, each causal over itself only."""
    within = torch.ones(s, s, dtype=torch.bool).tril()
    return torch.block_diag(*[within] * b)


def target_text(args, train_stream: torch.Tensor) -> torch.Tensor:
    """[N, seq_len]: --target-text windows of the training split, each cut to --prompt-len tokens and
    continued greedily by the target (speclite's own decoding; cached in --target-text-cache)."""
    cache = Path(args.target_text_cache) if args.target_text_cache else None
    if cache is not None and cache.exists():
        texts = torch.load(cache)
        if texts.shape == (args.target_text, args.seq_len):
            return texts
    from speclite import LLM, SamplingParams

    llm = LLM(args.target, device="cpu", dtype=torch.float32)
    params = SamplingParams(max_new_tokens=args.seq_len - args.prompt_len, ignore_eos=True)
    prompts = next(batches(train_stream, args.target_text, args.prompt_len - 1, torch.Generator().manual_seed(DATA_SEED)))
    began, out = time.time(), []
    for i, prompt in enumerate(prompts.tolist()):
        out.append(prompt + llm.engine.generate(prompt, params).token_ids)
        if (i + 1) % 200 == 0:
            print(f"target text {i + 1}/{len(prompts)} {time.time() - began:.0f}s", flush=True)
    texts = torch.tensor(out, dtype=torch.long)
    if cache is not None:
        torch.save(texts, cache)
    return texts


def rows(texts: torch.Tensor, batch_size: int, rng: torch.Generator):
    """Endless batches of random rows of texts [N, S]."""
    while True:
        yield texts[torch.randint(0, len(texts), (batch_size,), generator=rng)]


def teach(target, window: torch.Tensor, wants: Wants):
    """The target's Step over a batch of windows [B, S] (packed: speclite runs one sequence)."""
    b, s = window.shape
    cache = target.new_cache(b * s)
    tree = Tree(torch.arange(s).repeat(b), causal_blocks(b, s))
    with torch.no_grad():
        return target.step(window.flatten(), cache, tree=tree, wants=wants)


def kl(teacher_logp: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Mean KL(teacher || student) over rows."""
    return F.kl_div(student_logits.float().log_softmax(-1), teacher_logp, log_target=True,
                    reduction="batchmean")


# ---------------------------------------------------------------- heads from the target's states

def draft_vocab(stream: torch.Tensor, size: int, vocab: int) -> torch.Tensor:
    """Target ids of the `size` most frequent training tokens, ascending (EAGLE-3's draft vocabulary)."""
    counts = torch.bincount(stream, minlength=vocab)
    return torch.topk(counts, size).indices.sort().values


def new_eagle3(target, args, vocab_ids) -> tuple[Eagle3Head, dict]:
    t = target.args
    layer = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": t.hidden_size,
             "intermediate_size": args.intermediate, "num_attention_heads": t.num_heads,
             "num_key_value_heads": t.num_kv_heads, "num_hidden_layers": 1, "rms_norm_eps": t.rms_norm_eps,
             "rope_theta": t.rope["rope_theta"], "max_position_embeddings": t.max_position_embeddings,
             "vocab_size": t.vocab_size, "draft_vocab_size": args.draft_vocab, "tie_word_embeddings": False}
    head = Eagle3Head(ModelArgs.from_hf(layer), args.draft_vocab, 3 * t.hidden_size, EAGLE_LAYERS)
    with torch.no_grad():  # start from the target's own head, cut to the draft vocabulary
        head.lm_head.weight.copy_(target.lm_head.weight[vocab_ids])
    config = {**layer, "architectures": ["LlamaForCausalLMEagle3"], "target_hidden_size": t.hidden_size,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(EAGLE_LAYERS)}, "torch_dtype": "bfloat16"}
    return head, config


def new_mtp(target, args) -> tuple[MTPModule, dict]:
    config = json.loads((Path(args.target) / "config.json").read_text())
    config.update(num_hidden_layers=1, intermediate_size=args.intermediate, num_nextn_predict_layers=1,
                  layer_types=["full_attention"])
    module = MTPModule(ModelArgs.from_hf(config), own_head=False, state_first=False, normed_state=False)
    module.shared.append(target.lm_head)  # DeepSeek-V3's shared head: the target's own
    return module, config


def head_states(method: str, head, step) -> torch.Tensor:
    if method == "eagle3":
        return head.fuse(torch.cat([step.layers[i] for i in head.aux_layers], dim=-1))
    return step.final


def unrolled_loss(method, head, target, window, step, vocab_ids, steps_ahead):
    """The training-time test: `steps_ahead` chained head steps, each fed the head's own states.

    Row p of step j pairs (step 0: the target's state at p; later: the head's output of step j-1
    at row p) with token p + 1 + j, sits at position p + j and guesses token p + 2 + j, whose
    distribution is the target's at p + 1 + j. It attends, as when drafting, to the target's pairs
    0..p of its window (step 0's rows) and to its own rows of steps 1..j.
    """
    b, s = window.shape
    n = b * s
    first = causal_blocks(b, s)
    own = torch.eye(n, dtype=torch.bool)
    cache = head.new_cache(n * steps_ahead)
    hidden = head_states(method, head, step)
    t_logits = step.logits.view(b, s, -1)
    t_logp = t_logits[..., vocab_ids].float().log_softmax(-1)
    t_best = t_logits.argmax(-1)
    p = torch.arange(s)
    total, agree = 0.0, []
    for j in range(steps_ahead):
        tokens = window[:, (p + 1 + j).clamp(max=s - 1)].flatten()  # rows past the window: no loss
        if j:  # a fresh copy: the keys of earlier steps are saved for backward and must not change
            cache.layers = [(k.clone(), v.clone()) for k, v in cache.layers]
        mask = torch.cat([first] + [own] * j, dim=1)
        logits, hidden = head(target.model.embed_tokens(tokens), hidden, (p + j).repeat(b), cache, mask)
        valid = s - 1 - j  # rows whose guessed token has a teacher row in the window
        logits = logits.view(b, s, -1)[:, :valid]
        total = total + STEP_DECAY ** j * kl(t_logp[:, 1 + j:].flatten(0, 1), logits.flatten(0, 1))
        agree.append((vocab_ids[logits.argmax(-1)] == t_best[:, 1 + j:]).float().mean().item())
    return total, agree


def medusa_loss(heads, step, window):
    b, s = window.shape
    t_logits = step.logits.view(b, s, -1)
    logits = heads(step.final).view(len(heads), b, s, -1)
    total, agree = 0.0, []
    for i in range(len(heads)):
        # Head i at row p guesses token p + 2 + i: the target's distribution at p + 1 + i.
        guess, teacher = logits[i, :, : s - 1 - i], t_logits[:, 1 + i:]
        total = total + kl(teacher.float().log_softmax(-1).flatten(0, 1), guess.flatten(0, 1))
        agree.append((guess.argmax(-1) == teacher.argmax(-1)).float().mean().item())
    return total, agree


def new_medusa(target, args) -> tuple[MedusaHeads, dict]:
    heads = MedusaHeads(target.args, args.steps_ahead, 1, bias=True, own_head=False)
    heads.shared.append(target.lm_head)  # frozen with the target
    with torch.no_grad():
        for head in heads.heads:  # blocks at zero: each head starts as the target's next-token guess
            head.layers[0].weight.zero_()
            head.layers[0].bias.zero_()
    config = {"model_type": "medusa", "num_heads": args.steps_ahead, "num_hidden_layers": 1,
              "hidden_size": target.args.hidden_size, "vocab_size": target.args.vocab_size,
              "medusa_fc_bias": True, "original_lm_head": True, "base_model_name_or_path": "tiny-code"}
    return heads, config


# ---------------------------------------------------------------- PARD

def pard_rows(s: int, depth: int, rng: random.Random):
    """One window's PARD training rows: (anchor t, mask depth d) with d = 0 the real token t.

    Conditional drop-token (arXiv 2504.18583): depth 1 keeps every anchor, each later depth a
    random half of the previous depth's (so a kept mask row always has its shallower masks).
    Row (t, d) sits at position t + d and guesses token t + d + 1, so t + d < s.
    """
    rows = [(t, 0) for t in range(s)]
    anchors = list(range(s - 1))
    for d in range(1, depth + 1):
        if d > 1:
            anchors = [t for t in anchors if rng.random() < 0.5]
        anchors = [t for t in anchors if t + d < s]
        rows += [(t, d) for t in anchors]
    return rows


def pard_mask(rows) -> torch.Tensor:
    """Row (t, d) attends to real tokens 0..t and to its anchor's masks 1..d (itself included)."""
    t = torch.tensor([r[0] for r in rows])
    d = torch.tensor([r[1] for r in rows])
    real = (d[None, :] == 0) & (t[None, :] <= t[:, None])
    masks = (d[None, :] > 0) & (t[None, :] == t[:, None]) & (d[None, :] <= d[:, None])
    return real | masks


def pard_loss(draft, step, window, mask_token, depth, rng):
    b, s = window.shape
    t_logits = step.logits.view(b, s, -1)
    total, hits, counts = 0.0, [0.0] * (depth + 1), [0] * (depth + 1)
    for w in range(b):
        rows = pard_rows(s, depth, rng)
        t = torch.tensor([r[0] for r in rows])
        d = torch.tensor([r[1] for r in rows])
        tokens = torch.where(d == 0, window[w, t], mask_token)
        cache = draft.new_cache(len(rows))
        logits = draft.step(tokens, cache, tree=Tree(t + d, pard_mask(rows))).logits
        teacher = t_logits[w, t + d]
        total = total + kl(teacher.float().log_softmax(-1), logits) / b
        right = logits.argmax(-1) == teacher.argmax(-1)
        for j in range(depth + 1):
            hits[j] += right[d == j].float().sum().item()
            counts[j] += int((d == j).sum())
    return total, [h / max(c, 1) for h, c in zip(hits, counts)]


def unused_token(stream: torch.Tensor, vocab: int, special: int) -> int:
    """The mask token: the lowest id past the special tokens that never occurs in the training tokens
    (a BPE merge always merged further), so giving it a new meaning costs the draft nothing."""
    counts = torch.bincount(stream, minlength=vocab)
    return int(next(i for i in range(special, vocab) if counts[i] == 0))


# ---------------------------------------------------------------- saving

def bf16(tensors: dict) -> dict:
    return {k: v.detach().to(torch.bfloat16).contiguous() if v.is_floating_point() else v.contiguous()
            for k, v in tensors.items()}


def save_pard(draft, config, source: Path, out):
    for f in source.iterdir():  # tokenizer, template, generation config: the draft's own
        if f.suffix != ".safetensors" and f.name != "README.md":
            shutil.copy(f, out / f.name)
    with safe_open(str(source / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())  # the same tensors as the draft it adapts (the tied lm_head left out)
    state = draft.state_dict()
    save_file(bf16({n: state[n] for n in names}), out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


# ---------------------------------------------------------------- main

def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", required=True, choices=("eagle3", "mtp", "medusa", "pard"))
    p.add_argument("--out-dir", default=str(ASSETS))
    p.add_argument("--target", default=str(ASSETS / "tiny-code"))
    p.add_argument("--draft", default=str(ASSETS / "tiny-code-draft"), help="pard: the draft model to adapt")
    p.add_argument("--init", default=None,
                   help="eagle3, pard: continue from a directory this script saved (a second run of <= 12 minutes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--heldout-percent", type=int, default=5, help="train_tiny.py's split")
    p.add_argument("--stream-cache", default=None,
                   help="file keeping the tokenized corpus between runs (tokenizing it takes minutes)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--minutes", type=float, default=None, help="stop early after this wall time")
    p.add_argument("--lr", type=float, default=None, help="default: 1e-3, pard 3e-4")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps-ahead", type=int, default=4,
                   help="eagle3/mtp: unrolled steps; medusa: heads; pard: 1 + mask tokens")
    p.add_argument("--intermediate", type=int, default=512, help="eagle3/mtp: the block's MLP width")
    p.add_argument("--draft-vocab", type=int, default=2048, help="eagle3: draft vocabulary size")
    p.add_argument("--target-text", type=int, default=0,
                   help="train on the target's greedy continuations of this many training windows (0: the corpus)")
    p.add_argument("--prompt-len", type=int, default=32, help="--target-text: tokens of each window kept as the prompt")
    p.add_argument("--target-text-cache", default=None, help="file keeping the generated text between runs")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    began = time.time()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    cache = Path(args.stream_cache) if args.stream_cache else None
    if cache is not None and cache.exists():
        train_stream, heldout_stream = torch.load(cache)
    else:
        train_docs, heldout_docs = load_corpus(args.heldout_percent)
        # The documents in train_tiny.py's default order whatever --seed (which draws the batches),
        # so a run continued with another seed reads the same cached stream.
        train_stream = token_stream(tokenizer, train_docs, DATA_SEED)
        heldout_stream = token_stream(tokenizer, heldout_docs, DATA_SEED)
        if cache is not None:
            torch.save((train_stream, heldout_stream), cache)
    print(f"{len(train_stream)} train tokens, {len(heldout_stream)} held-out; {time.time() - began:.0f}s", flush=True)

    target = load_model(args.target, device="cpu", dtype=torch.float32).requires_grad_(False)
    vocab = target.args.vocab_size
    draw = (lambda gen: batches(train_stream, args.batch_size, args.seq_len - 1, gen))
    if args.target_text:
        texts = target_text(args, train_stream)
        print(f"training on {len(texts)} target continuations of {args.seq_len - args.prompt_len} tokens", flush=True)
        draw = (lambda gen: rows(texts, args.batch_size, gen))
    vocab_ids = torch.arange(vocab)
    wants = Wants(final=True)
    if args.method == "eagle3" and args.init:
        model = load_head(args.init, target.args, "cpu", torch.float32)
        config, vocab_ids = json.loads((Path(args.init) / "config.json").read_text()), model.target_ids
        wants = Wants(layers=EAGLE_LAYERS)
    elif args.method == "eagle3":
        vocab_ids = draft_vocab(train_stream, args.draft_vocab, vocab)
        share = torch.bincount(train_stream, minlength=vocab)[vocab_ids].sum() / len(train_stream)
        print(f"draft vocabulary of {args.draft_vocab} covers {share:.1%} of training tokens", flush=True)
        model, config = new_eagle3(target, args, vocab_ids)
        wants = Wants(layers=EAGLE_LAYERS)
    elif args.method == "mtp":
        model, config = new_mtp(target, args)
    elif args.method == "medusa":
        model, config = new_medusa(target, args)
    else:
        args.draft = args.init or args.draft
        model = load_model(args.draft, device="cpu", dtype=torch.float32)
        config = json.loads((Path(args.draft) / "config.json").read_text())
        mask_token = unused_token(train_stream, vocab, len(tokenizer.all_special_ids))
        config["pard_token"] = mask_token
        print(f"mask token {mask_token} {tokenizer.convert_ids_to_tokens(mask_token)!r}", flush=True)
        wants = Wants()
    if args.method in ("eagle3", "mtp") and not args.init:
        model.init_rope("cpu")
    if args.init and args.method in ("mtp", "medusa"):
        raise SystemExit("--init continues eagle3 and pard runs only")

    def loss_of(window, step):
        if args.method in ("eagle3", "mtp"):
            return unrolled_loss(args.method, model, target, window, step, vocab_ids, args.steps_ahead)
        if args.method == "medusa":
            return medusa_loss(model, step, window)
        return pard_loss(model, step, window, mask_token, args.steps_ahead - 1, rng)

    params = [p for p in model.parameters()]
    for p in params:
        p.requires_grad_(True)
    n_params = sum(p.numel() for p in params)
    print(f"{args.method}: {n_params / 1e6:.2f}M trainable parameters", flush=True)
    lr = args.lr or (3e-4 if args.method == "pard" else 1e-3)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0 if args.method == "pard" else 0.01)
    gen = torch.Generator().manual_seed(args.seed)
    model.train()
    start, done = time.time(), 0
    for i, window in zip(range(args.steps), draw(gen)):
        for group in opt.param_groups:
            group["lr"] = lr_at(i, args.steps, lr, args.warmup)
        step = teach(target, window, wants)
        loss, agree = loss_of(window, step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = i + 1
        if i % args.log_every == 0 or done == args.steps:
            print(f"step {i}/{args.steps} loss {loss.item():.3f} agree {' '.join(f'{a:.2f}' for a in agree)} "
                  f"{time.time() - start:.0f}s", flush=True)
        if args.minutes and time.time() - start > 60 * args.minutes:
            print(f"stopping after {done} steps: --minutes {args.minutes}", flush=True)
            break
    model.eval()
    train_s = time.time() - start

    # Held-out, teacher forcing: how often each step's guess is the target's own greedy token.
    eval_gen = torch.Generator().manual_seed(args.seed + 1)
    sums = None
    with torch.no_grad():
        for _, window in zip(range(args.eval_batches), batches(heldout_stream, args.batch_size, args.seq_len - 1, eval_gen)):
            _, agree = loss_of(window, teach(target, window, wants))
            sums = agree if sums is None else [a + b for a, b in zip(sums, agree)]
    heldout = [a / args.eval_batches for a in sums]
    print(f"held-out agreement by step: {' '.join(f'{a:.3f}' for a in heldout)}", flush=True)

    out = Path(args.out_dir) / f"tiny-code-{args.method}"
    out.mkdir(parents=True, exist_ok=True)
    if args.method == "pard":
        save_pard(model, config, Path(args.draft), out)
    elif args.method == "eagle3":
        save_head(bf16(model.state_dict()), vocab_ids, config, out)
    elif args.method == "mtp":
        save_module(bf16(model.state_dict()), {**config, "dtype": "bfloat16"}, out)
    else:
        save_heads(bf16(model.state_dict()), config, out)
    for f in out.iterdir():
        f.chmod(0o644)  # safetensors writes its files private; these ship in the package
    summary = {"method": args.method, "steps": done, "train_seconds": round(train_s),
               "wall_seconds": round(time.time() - began), "trainable_parameters": n_params,
               "heldout_agreement_by_step": [round(a, 4) for a in heldout],
               "command": "python " + " ".join(sys.argv)}
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
