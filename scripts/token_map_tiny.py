"""The embedded pair's --token-map: tiny-code's most frequent tokens over train_tiny.py's training
split (the held-out files left out, as for the models), EOS among them, in FR-Spec's format.

    python scripts/token_map_tiny.py --size 1024   # -> speclite/assets/tiny-code/freq_1024.pt
"""

import argparse
from pathlib import Path

from train_tiny import load_corpus

from speclite.api import eos_ids
from speclite.model.tokenizer import load_tokenizer
from speclite.speculate import token_map

ASSET = Path(__file__).resolve().parent.parent / "speclite" / "assets" / "tiny-code"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--heldout-percent", type=int, default=5, help="as train_tiny.py's")
    args = p.parse_args()
    train, _ = load_corpus(args.heldout_percent)
    tokenizer = load_tokenizer(ASSET)
    counts = token_map.count(tokenizer, train)
    ids = token_map.most_frequent(counts, args.size, sorted(eos_ids(ASSET, tokenizer)))
    out = ASSET / f"freq_{args.size}.pt"
    token_map.save(ids, out)
    total = sum(counts.values())
    print(f"{out}: {len(ids)} of {len(tokenizer)} tokens, {sum(counts[i] for i in ids) / total:.1%} of the "
          f"{total} training tokens")


if __name__ == "__main__":
    main()
