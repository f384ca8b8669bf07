"""Where a round of the default `mars generate` goes: drafting, the target's forward, verification.

The default session (draft head, tree shape and draft length from the cost model) in bfloat16 with
packed and with dense linears (`--packed-weights on` / `off`, mars_cli/packing.py) and in float32,
one loaded target each, variants alternating per sample (A B / B A) over the eval
suites' first turns. Reported per variant: milliseconds per round in each phase the loop times (`prefill`,
`draft`, `target`, `verify`, `rollback`, `other`), tau, tokens/s, and drafting's share of a round
(issue 27's goal: at most 1/6).

    python benchmarks/bench_round.py --suites chat,code --limit 8 --out benchmarks/results/round-<machine>.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench_auto import write_record
from mars_cli.evaluation.suites import load_suite
from mars_cli.models import load_model
from mars_cli.options import DecodingOptions
from mars_cli.session import Session

VARIANTS = {"bfloat16 packed": ("bfloat16", "on"), "bfloat16 dense": ("bfloat16", "off"), "float32": ("float32", "off")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default="chat,code")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    sessions = {}
    for name, (dtype, packed) in VARIANTS.items():
        target = load_model("smollm2-135m", dtype=dtype)
        sessions[name] = Session(DecodingOptions.of(max_new_tokens=args.max_new_tokens, dtype=dtype, draft="auto",
                                                    num_draft="auto", packed_weights=packed), target=target)
    prompts = [sample.turns[0] for suite in args.suites.split(",") for sample in load_suite(suite, args.limit).samples]
    for session in sessions.values():  # warm-up: kernels, cost curves, the chooser's first rounds
        session.run(prompts[0])
    totals = {name: {"tokens": 0, "rounds": 0, "phases": {}} for name in sessions}
    order = list(sessions)
    for index, prompt in enumerate(prompts):
        for name in (order if index % 2 == 0 else order[::-1]):
            summary = sessions[name].run(prompt).stats.summary()
            total = totals[name]
            total["tokens"] += summary["new_tokens"]
            total["rounds"] += summary["rounds"]
            for phase, seconds in summary["time_s"].items():
                total["phases"][phase] = total["phases"].get(phase, 0.0) + seconds
    rows = {}
    for name, total in totals.items():
        wall = sum(total["phases"].values())
        per_round = {phase: 1000 * seconds / total["rounds"] for phase, seconds in total["phases"].items()}
        rows[name] = {"tokens_per_s": total["tokens"] / wall, "tau": total["tokens"] / total["rounds"],
                      "ms_per_round": per_round, "draft_share": total["phases"].get("draft", 0.0) / wall,
                      "tree": str(sessions[name].tree)}
        phases = " ".join(f"{phase} {ms:.1f}" for phase, ms in per_round.items())
        print(f"{name:18s} {rows[name]['tokens_per_s']:6.2f} tok/s  tau {rows[name]['tau']:.2f}  draft share "
              f"{rows[name]['draft_share']:.1%}  ms/round: {phases}")
    if args.out:
        write_record(args.out, suites=args.suites, limit=args.limit, max_new_tokens=args.max_new_tokens, rows=rows)


if __name__ == "__main__":
    main()
