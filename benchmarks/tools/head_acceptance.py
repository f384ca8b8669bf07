"""A draft head's acceptance in real decoding, the figures `--draft-topk auto` weighs shapes by.

Decodes the held-out suites' first turns greedily with the head (strict verification, so the
figures are the target's own agreement with the head): k = 4 chains with no confidence gate (every
round drafts all four, so P(position i accepted | those before were) is accepted at i over
accepted at i - 1), and 4-wide trees of 8, 16 and 32 nodes searched 3 levels (tau: tokens a round).
Greedy decoding makes the counts independent of timing: run it on a busy machine if need be.
`--write` records them in the head's config.json as `mars.acceptance` (decoding/acceptance.py).

    python benchmarks/tools/head_acceptance.py --head mars_cli/heads/smollm2-135m --dtype bfloat16 --write
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mars_cli.decoding.acceptance import DraftAcceptance
from mars_cli.decoding.stats import DecodeStats
from mars_cli.evaluation.suites import load_suite
from mars_cli.head.eagle3 import CONFIG_FILE
from mars_cli.options import DecodingOptions
from mars_cli.paths import write_atomic
from mars_cli.session import Session

CHAIN_DRAFTS = 4
TREE_SIZES = (8, 16, 32)
TREE_LEVELS = 3


def decode_all(session: Session, prompts: list[str]) -> DecodeStats:
    """Every prompt decoded by `session`, the counts summed."""
    total = DecodeStats()
    for prompt in prompts:
        total.merge(session.run(session.encode(prompt)).stats)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", type=Path, required=True, help="an EAGLE-3 head directory")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--suites", default="chat,code")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--write", action="store_true", help="record the figures in the head's config.json")
    args = parser.parse_args()

    prompts = [sample.turns[0] for name in args.suites.split(",") for sample in load_suite(name, args.limit).samples]
    common = dict(target=args.target, dtype=args.dtype, draft=f"head:{args.head}", max_new_tokens=args.max_new_tokens,
                  packed_weights="off")
    chain = Session(DecodingOptions.of(**common, num_draft=str(CHAIN_DRAFTS), draft_topk="1", head_confidence=0.0))
    counts = decode_all(chain, prompts)
    reached = [counts.rounds] + counts.accepted_at[: CHAIN_DRAFTS - 1]
    rates = [round(accepted / before, 3) if before else 0.0 for accepted, before in zip(counts.accepted_at, reached)]
    print(f"chain of {CHAIN_DRAFTS}: tau {counts.new_tokens / counts.rounds:.2f}, P(accepted | those before) {rates}")
    taus = {}
    for size in TREE_SIZES:
        tree = Session(DecodingOptions.of(**common, num_draft=str(TREE_LEVELS), draft_topk="4", draft_tokens=str(size)),
                       target=chain.target)
        counts = decode_all(tree, prompts)
        taus[str(size)] = round(counts.new_tokens / counts.rounds, 2)
        print(f"4 x {size} tree, {TREE_LEVELS} levels: tau {taus[str(size)]}")
    entry = {"chain": rates, "tree_tau": taus}
    DraftAcceptance.from_json(entry, "measured figures", "check")  # in range, as a loader would read them
    command = (f"python benchmarks/tools/head_acceptance.py --head {args.head} --dtype {args.dtype} --suites {args.suites} "
               f"--limit {args.limit} --max-new-tokens {args.max_new_tokens}")
    entry["measured"] = (f"{command}: held-out first turns, strict greedy; chain: k = {CHAIN_DRAFTS} with no confidence gate; "
                         f"tree_tau: 4-wide trees searched {TREE_LEVELS} levels")
    print(json.dumps(entry, indent=1))
    if args.write:
        path = args.head / CONFIG_FILE
        config = json.loads(path.read_text())
        config.setdefault("mars", {})["acceptance"] = entry
        write_atomic(path, json.dumps(config, indent=1) + "\n")
        print(f"written to {path}")


if __name__ == "__main__":
    main()
