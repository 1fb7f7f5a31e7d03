"""Train tiny-code-dflash: a DFlash block drafter (arXiv 2602.06036) for the embedded tiny-code target.

The target is frozen; the drafter learns from its hidden states and its own next-token
distributions on the stdlib corpus of scripts/train_tiny.py (same held-out split). Each step
samples anchor positions in training windows; an anchor's block is [its token, mask x
(block_size - 1)] at the positions after it, conditioned on the target's states of the positions
before it, and row i is trained toward the target's distribution of the token at anchor + i
(KL, rows weighted exp(-(i - 1) / gamma) as in the paper: early rows gate acceptance).

The training forward is speclite's inference forward, batched: the blocks of one window share a
scratch cache whose first rows hold the window's injected context (DFlashLayer.inject) and run
through the same DFlashLayer blocks, each under a mask that shows it the context before its anchor
and its own rows. Saved in the published layout speclite loads (speclite/speculate/dflash/load.py).

`--target-text N` trains on N of the target's own greedy continuations of training windows
(train_heads.py's, the same cache file): the text the drafter is asked to continue at run time.
`--init DIR` continues from a saved drafter.

    nice -n 10 python scripts/train_dflash.py --out-dir speclite/assets/tiny-code-dflash
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_tiny import batches, load_corpus, lr_at, token_stream  # noqa: E402
from train_heads import rows, target_text  # noqa: E402

from speclite.model import load_model  # noqa: E402
from speclite.model.decoder import ModelArgs, rope_tables  # noqa: E402
from speclite.model.step import Wants  # noqa: E402
from speclite.speculate.dflash.draft import DFlashDraft  # noqa: E402
from speclite.speculate.dflash.load import parse_config  # noqa: E402
from speclite.speculate.dflash.save import save_drafter  # noqa: E402

TARGET = Path(__file__).resolve().parent.parent / "speclite" / "assets" / "tiny-code"
# Byte-level BPE maps byte 0xFF to 'ÿ': valid UTF-8 never contains that byte and no merge was
# learned from it, so the tokenizer never produces this token from text: free to mean "mask".
MASK_PIECE = "ÿ"


def drafter_config(target_cfg: dict, args, mask_token: int) -> dict:
    """The published DFlash config: a Qwen3 layer config plus dflash_config."""
    t = target_cfg
    return dict(
        architectures=["DFlashDraftModel"], model_type="qwen3", hidden_size=t["hidden_size"],
        intermediate_size=t["intermediate_size"], num_hidden_layers=args.layers,
        num_attention_heads=t["num_attention_heads"], num_key_value_heads=t["num_key_value_heads"],
        head_dim=t["hidden_size"] // t["num_attention_heads"], vocab_size=t["vocab_size"],
        rms_norm_eps=t["rms_norm_eps"], max_position_embeddings=t["max_position_embeddings"],
        rope_theta=t["rope_parameters"]["rope_theta"], attention_bias=False, hidden_act="silu",
        tie_word_embeddings=False, layer_types=["full_attention"] * args.layers, dtype="bfloat16",
        num_target_layers=t["num_hidden_layers"],
        dflash_config=dict(target_layer_ids=args.target_layer_ids, block_size=args.block_size,
                           mask_token_id=mask_token))


def init_weights(draft: DFlashDraft, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, p in draft.named_parameters():
        if name.endswith("norm.weight"):
            p.data.fill_(1.0)
        else:
            p.data.normal_(0.0, 0.02, generator=g)


@torch.no_grad()
def target_pass(target, window: torch.Tensor, draft: DFlashDraft):
    """(fused-ready concatenated states [L, n*H], log-probs [L, V]) of one window, as speclite's target computes them."""
    wants = Wants(layers=tuple(sorted({i + 1 for i in draft.target_layers})))
    step = target.step(window, target.new_cache(window.shape[0]), wants=wants)
    states = torch.cat([step.layers[i + 1] for i in draft.target_layers], dim=-1)
    return states, step.logits.float().log_softmax(-1)


def block_forward(draft: DFlashDraft, embed, lm_head, states, window, anchors):
    """Logits [A, block_size - 1, V] of the blocks at `anchors`, each seeing the context before its anchor.

    What DFlashDraft.forward computes block by block at inference: the context rows are injected at
    their positions, every block row attends to the context entries before its anchor and to the
    rows of its own block.
    """
    b, a, n = draft.block_size, anchors.shape[0], window.shape[0]
    context = draft.fuse(states)
    ids = torch.full((a, b), draft.mask_token, dtype=torch.long)
    ids[:, 0] = window[anchors]
    x = embed(ids.flatten())
    block_pos = (anchors[:, None] + torch.arange(b)).flatten()
    cos, sin = rope_tables(torch.cat([torch.arange(n), block_pos]), draft.inv_freq, draft.rope_scale, x.dtype)
    owner = anchors.repeat_interleave(b)  # each block row's anchor
    sees_context = torch.arange(n)[None, :] < owner[:, None]
    sees_block = owner[:, None] == owner[None, :]  # anchors are distinct
    mask = torch.cat([sees_context, sees_block], dim=1)
    a_args = draft.args
    for layer in draft.model.layers:
        # A scratch cache per layer: autograd follows the writes into it.
        cache = (torch.zeros(a_args.num_kv_heads, n + a * b, a_args.head_dim),
                 torch.zeros(a_args.num_kv_heads, n + a * b, a_args.head_dim))
        layer.inject(context, cos[:n], sin[:n], cache, 0)
        x = layer(x, cos[n:], sin[n:], cache, n, mask)
    hidden = draft.model.norm(x).view(a, b, -1)[:, 1:]
    return lm_head(hidden)


def sample_anchors(n: int, block: int, count: int, rng) -> torch.Tensor:
    """Distinct anchors whose block fits in the window and which have context before them."""
    return (torch.randperm(n - block, generator=rng)[:count] + 1).sort().values


def step_loss(draft, target, window_batch, args, rng, weights):
    """Mean over windows of the row-weighted KL(target || drafter), and the rows' greedy agreement."""
    total, agree, rows = 0.0, 0, 0
    for window in window_batch:
        states, target_logp = target_pass(target, window, draft)
        anchors = sample_anchors(window.shape[0], args.block_size, args.anchors, rng)
        logits = block_forward(draft, target.model.embed_tokens, target.lm_head, states, window, anchors)
        # Row i of the block at anchor a predicts the token at a + i: the target's logits at a + i - 1.
        teacher = target_logp[anchors[:, None] + torch.arange(args.block_size - 1)]
        logp = logits.float().log_softmax(-1)
        kl = (teacher.exp() * (teacher - logp)).sum(-1)  # [A, block_size - 1]
        total = total + (kl * weights).sum() / (weights.sum() * anchors.shape[0])
        agree += (logp.argmax(-1) == teacher.argmax(-1)).sum(0)
        rows += anchors.shape[0]
    return total / len(window_batch), agree / rows


def train(draft, target, draw, args):
    """`draw(rng)`: endless batches of training windows [B, S]."""
    params = [p for p in draft.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    rng = torch.Generator().manual_seed(args.seed)
    weights = torch.exp(-torch.arange(args.block_size - 1) / args.gamma)
    began = time.time()
    step = 0
    for step, window in zip(range(args.steps), draw(rng)):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        loss, agree = step_loss(draft, target, window, args, rng, weights)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % args.log_every == 0 or step == args.steps - 1:
            shown = " ".join(f"{a:.2f}" for a in agree.tolist())
            print(f"step {step}/{args.steps} KL {loss.item():.3f} agree by row {shown} "
                  f"{time.time() - began:.0f}s", flush=True)
        if time.time() - began > args.max_minutes * 60:
            print(f"stopped at step {step}: --max-minutes {args.max_minutes}", flush=True)
            break
    return step + 1, time.time() - began


@torch.no_grad()
def evaluate(draft, target, stream, args):
    """Held-out greedy agreement of each block row with the target (teacher forcing, fixed anchors)."""
    rng = torch.Generator().manual_seed(args.seed + 1)
    agree, count = 0, 0
    for i in range(args.eval_windows):
        window = stream[i * args.seq_len:(i + 1) * args.seq_len]
        states, target_logp = target_pass(target, window, draft)
        anchors = sample_anchors(window.shape[0], args.block_size, args.anchors, rng)
        logits = block_forward(draft, target.model.embed_tokens, target.lm_head, states, window, anchors)
        teacher = target_logp[anchors[:, None] + torch.arange(args.block_size - 1)]
        agree = agree + (logits.argmax(-1) == teacher.argmax(-1)).sum(0)
        count += anchors.shape[0]
    return (agree / count).tolist()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="speclite/assets/tiny-code-dflash")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="one thread: measured 10x faster than two on the shared 2-core CPU")
    p.add_argument("--heldout-percent", type=int, default=5, help="must match train_tiny.py's split")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--target-layer-ids", type=int, nargs="+", default=[1, 3, 5])
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=260)
    p.add_argument("--max-minutes", type=float, default=14.0, help="stop early past this much training time")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--gamma", type=float, default=4.0, help="row weight exp(-(i-1)/gamma), the paper's for block 8")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--anchors", type=int, default=32, help="blocks per window")
    p.add_argument("--eval-windows", type=int, default=32)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--init", default=None, help="continue from this drafter directory (its config wins)")
    p.add_argument("--target-text", type=int, default=0, help="train on N of the target's greedy continuations")
    p.add_argument("--prompt-len", type=int, default=32, help="--target-text: tokens of each window kept as the prompt")
    p.add_argument("--target-text-cache", default=None, help="file keeping the generated text (train_heads.py's)")
    args = p.parse_args()
    args.target = str(TARGET)  # what train_heads.target_text generates with
    return args


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    began = time.time()
    tokenizer = AutoTokenizer.from_pretrained(TARGET)
    mask = tokenizer.convert_tokens_to_ids(MASK_PIECE)
    train_docs, heldout_docs = load_corpus(args.heldout_percent)
    train_stream = token_stream(tokenizer, train_docs, args.seed)
    heldout_stream = token_stream(tokenizer, heldout_docs, args.seed)
    if (train_stream == mask).any() or (heldout_stream == mask).any():
        raise SystemExit(f"mask token {mask} occurs in the corpus")
    print(f"{len(train_stream)} train / {len(heldout_stream)} held-out tokens, mask {mask}; "
          f"{time.time() - began:.0f}s", flush=True)

    target = load_model(TARGET, "cpu", torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    target_cfg = json.loads((TARGET / "config.json").read_text())
    cfg = json.loads((Path(args.init) / "config.json").read_text()) if args.init else drafter_config(target_cfg, args, mask)
    layer_cfg, ids, block, mask = parse_config(cfg, "tiny-code-dflash", None)  # what the loader will read
    draft = DFlashDraft(ModelArgs.from_hf(layer_cfg), ids, block, mask)
    if args.init:
        saved = load_file(str(Path(args.init) / "model.safetensors"))
        draft.load_state_dict({f"model.{name}": t.float() for name, t in saved.items()})
        args.block_size = block
    else:
        init_weights(draft, args.seed)
    draft.init_rope("cpu")
    print(f"drafter: {sum(p.numel() for p in draft.parameters()) / 1e6:.2f}M parameters", flush=True)

    draw = (lambda rng: batches(train_stream, args.batch_size, args.seq_len - 1, rng))
    if args.target_text:
        texts = target_text(args, train_stream)
        print(f"training on {len(texts)} target continuations of {args.seq_len - args.prompt_len} tokens", flush=True)
        draw = (lambda rng: rows(texts, args.batch_size, rng))
    steps, wall = train(draft, target, draw, args)
    out = Path(args.out_dir)
    save_drafter({name: p.detach().to(torch.bfloat16) for name, p in draft.named_parameters()}, cfg, out)
    agree = evaluate(draft, target, heldout_stream, args)
    print(f"held-out greedy agreement by row: {' '.join(f'{a:.3f}' for a in agree)}", flush=True)
    print(json.dumps({"steps": steps, "train_seconds": round(wall), "heldout_row_agreement": agree}), flush=True)
    print(f"done in {time.time() - began:.0f}s", flush=True)


if __name__ == "__main__":
    main()
