"""Averages EAGLE-3 head directories fine-tuned from one head (a "model soup") into a new one.

    python benchmarks/tools/head_soup.py mars_cli/heads/smollm2-135m STUDY/s14 STUDY/s15 STUDY/s16 --out soup

Every head must share the first one's draft vocabulary (`d2t`, `t2d`) and tensor shapes: heads
fine-tuned from a common start keep them. The soup's floating tensors are the mean of the heads'
(computed in float32, stored in the first head's dtype), its config.json the first head's.
Measured with `tree_replay.py --head head:soup` (docs/head.md).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("heads", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    missing = [str(head) for head in args.heads if not (head / WEIGHTS).is_file() or not (head / CONFIG).is_file()]
    if missing:
        sys.exit(f"head_soup.py: not an EAGLE-3 head directory with {WEIGHTS} and {CONFIG}: {missing[0]}")
    weights = [load_file(str(head / WEIGHTS)) for head in args.heads]
    first = weights[0]
    for head, tensors in zip(args.heads[1:], weights[1:]):
        if tensors.keys() != first.keys() or any(tensors[n].shape != first[n].shape for n in first):
            sys.exit(f"head_soup.py: {head} has other tensors or shapes than {args.heads[0]}")
        if any(not torch.equal(tensors[n], first[n]) for n in first if not first[n].is_floating_point()):
            sys.exit(f"head_soup.py: {head} drafts another vocabulary than {args.heads[0]}")
    soup = {name: (sum(t[name].float() for t in weights) / len(weights)).to(tensor.dtype)
            if tensor.is_floating_point() else tensor for name, tensor in first.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(soup, str(args.out / WEIGHTS), metadata={"format": "pt"})
    shutil.copy(args.heads[0] / CONFIG, args.out / CONFIG)
    print(f"{args.out}: the mean of {len(weights)} heads")


if __name__ == "__main__":
    main()
