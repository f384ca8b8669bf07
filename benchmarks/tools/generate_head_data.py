"""Answers a share of `mars train-head`'s prompts into a generations.jsonl for its training cache.

On another machine (a GPU, where batched generation is many times faster); the file is appended
to the training cache.

    python benchmarks/tools/generate_head_data.py --prompts mars_cli/data/head_prompts_large.jsonl \
        --max-new-tokens 256 --sampled-share 0.5 --modes sampled-then-greedy --batch 1024 --device cuda --out gen.jsonl

The answering recipe (length, sampled share, temperature, seed) must be the one train-head is
run with: its lines then stand for the same prompts in the same modes. Batches are written as
they finish, so a run cut short keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mars_cli.decoding import packing
from mars_cli.head.data import Answering, generate
from mars_cli.models import load_model
from mars_cli.prompts import load_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--sampled-share", type=float, default=0.0)
    parser.add_argument("--sample-temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", choices=("all", "sampled", "greedy", "sampled-then-greedy"), default="all")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--every", type=int, default=1,
                        help="answer only the prompts whose index is a multiple of this (a study's subset)")
    parser.add_argument("--offset", type=int, default=0,
                        help="with --every N: the prompts whose index leaves this remainder instead (another subset)")
    parser.add_argument("--category", default="",
                        help="answer only the prompts whose `category` field is this (e.g. a set's follow-ups)")
    parser.add_argument("--packed-weights", choices=("on", "off"), default="off",
                        help="on: the target's linears on prepacked oneDNN weights (CPU; see mars_cli/packing.py)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    prompts, _, _ = load_prompts(args.prompts, args.prompts, 10, conversations=True)
    answering = Answering(args.max_new_tokens, args.sampled_share, args.sample_temperature, seed=args.seed)
    target = load_model(args.target, device=args.device, dtype=args.dtype)
    if args.packed_weights == "on":
        problem = packing.problem(target.model)
        if problem:
            parser.error(f"--packed-weights on: {problem}")
        packing.install(target.model, rows=args.batch)

    def report(stage: str, done: int, total: int) -> None:
        print(f"{stage} {done}/{total}", file=sys.stderr, flush=True)

    # sampled prompts first (shortest first), then greedy ones longest first: another machine
    # answering the greedy ones shortest first (train-head's order) meets this one in the middle
    passes = {"all": [(None, False)], "sampled": [(answering.sampled, False)],
              "greedy": [(lambda i: not answering.sampled(i), True)],
              "sampled-then-greedy": [(answering.sampled, False), (lambda i: not answering.sampled(i), True)]}
    if args.category:  # load_prompts keeps the prompts only; the category is read from the lines
        categories = [json.loads(line).get("category") for line in args.prompts.read_text().splitlines()
                      if line.strip()]
    for select, longest_first in passes[args.modes]:
        if args.category:
            select = (lambda pick: lambda i: categories[i] == args.category and (pick is None or pick(i)))(select)
        if args.every > 1:
            select = (lambda pick: lambda i: i % args.every == args.offset % args.every
                      and (pick is None or pick(i)))(select)
        answered = generate(target, prompts, args.out, answering, args.batch, report, select, longest_first)
        print(f"{len(answered)} answers, {sum(len(s.output_ids) for s in answered)} answer tokens in {args.out}",
              flush=True)


if __name__ == "__main__":
    main()
