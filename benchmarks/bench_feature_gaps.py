"""What skipping features in plain rounds costs the head's acceptance (issue 26).

While `--num-draft auto` has drafting off, plain rounds ask the target for no hidden states, so
the draft head's cache lacks those positions' pairs when it next drafts (a probe). This runs the
same prompts with a fixed schedule, a k-token draft every `period`-th round, with features kept
in every round (as before: the head reads every pair) and only in the `lead` plain rounds before
each draft (as decoding now does, with AdaptiveDraftLength.FEATURE_LEAD), and compares the
drafting rounds' acceptance. Strict greedy in float32, so every variant emits the same tokens;
only what the head knows differs.

    python benchmarks/bench_feature_gaps.py --limit 12 --out benchmarks/results/feature-gaps.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from mars_cli.tuning.machine import cpu_matrix_flags as _cpu_matrix_flags, cpu_name as _cpu_name
from mars_cli.decoding.loop import DecodeSettings, decode
from mars_cli.decoding.stats import DecodeStats
from mars_cli.options import DecodingOptions
from mars_cli.session import Session
from mars_cli.evaluation.suites import load_suite


class EveryNth:
    """A draft schedule in place of the cost model: k drafts every `period`-th round; the drafting
    rounds and the `lead` plain rounds before each keep features (None: every round does)."""

    def __init__(self, period: int, k: int, lead: int | None) -> None:
        self.period, self.k, self.lead = period, k, lead
        self.round = 0

    def choose(self, room: int) -> int:
        self.round += 1
        return min(self.k, room) if self.round % self.period == 0 else 0

    def keep_features(self) -> bool:
        return self.lead is None or any((self.round + ahead) % self.period == 0 for ahead in range(self.lead + 1))

    def defer(self) -> None:
        raise AssertionError("the schedule keeps the features its drafts need")

    def observe(self, *args: object, **kwargs: object) -> None:
        """A fixed schedule learns nothing from a round."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default="chat,code")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--periods", default="4,16")
    parser.add_argument("--leads", default="1,8", help="plain rounds before a draft that keep features")
    parser.add_argument("--num-draft", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    session = Session(DecodingOptions.of(dtype="float32", draft="head", num_draft=args.num_draft,
                                         head_confidence=0.0, max_new_tokens=args.max_new_tokens))
    prompts = []
    for suite in args.suites.split(","):
        prompts += [session.encode(sample.turns[0]) for sample in load_suite(suite).samples[: args.limit]]
    variants = {"every round": None, **{f"lead {lead}": int(lead) for lead in args.leads.split(",")}}
    rows = []
    for period in [int(p) for p in args.periods.split(",")]:
        outputs, figures = {}, {}
        for name, lead in variants.items():
            stats = DecodeStats()
            outputs[name] = []
            for ids in prompts:
                one = DecodeStats()
                schedule = EveryNth(period, args.num_draft, lead)
                settings = DecodeSettings(args.max_new_tokens, args.num_draft)
                outputs[name].append([t for chunk in decode(session.scorer, session.drafter, session.verifier, ids,
                                                             settings, None, one, draft_length=schedule) for t in chunk])
                stats.merge(one)
            drafting_rounds = stats.drafted_at[0] if stats.drafted_at else 0
            figures[name] = {
                "drafting_rounds": drafting_rounds,
                "accepted_per_drafting_round": stats.accepted / max(drafting_rounds, 1),
                "acceptance_by_position": [a / d if d else None for a, d in zip(stats.accepted_at, stats.drafted_at)],
            }
            print(period, name, figures[name], file=sys.stderr)
        exact = figures["every round"]["accepted_per_drafting_round"]
        rows.append({"period": period, "same_tokens": all(o == outputs["every round"] for o in outputs.values()),
                     "variants": figures,
                     "vs_every_round": {name: f["accepted_per_drafting_round"] / max(exact, 1e-9)
                                        for name, f in figures.items()}})
    result = {
        "command": " ".join(["python", *sys.argv]),
        "machine": {"cpu": " ".join([_cpu_name(), *_cpu_matrix_flags()]), "threads": torch.get_num_threads(),
                    "torch": torch.__version__},
        "config": {"suites": args.suites, "limit": args.limit, "num_draft": args.num_draft,
                   "max_new_tokens": args.max_new_tokens, "dtype": "float32", "verify": "strict"},
        "rows": rows,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
