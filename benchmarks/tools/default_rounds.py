"""Where the default `mars generate` spends its rounds against plain decoding (issue 26).

One loaded target, a plain session (`--draft none`) and the default (`--draft auto --num-draft
auto`) under each `--verify` rule, the same prompts interleaved (each session first in turn);
prints tokens/s, milliseconds per round by phase, the ratios, and what each chooser learnt. `--chooser-off` keeps the default from ever drafting (no probes either), which
measures what its plain rounds cost over a plain step: the chooser's bookkeeping, and anything a
round that does not draft still pays.

    python benchmarks/tools/default_rounds.py --dtype bfloat16
    python benchmarks/tools/default_rounds.py --dtype bfloat16 --chooser-off --limit 6 --repeats 2
    python benchmarks/tools/default_rounds.py --dtype bfloat16 --verify strict,mars   # and the default with MARS
    python benchmarks/tools/default_rounds.py --dtype bfloat16 --int8-head off,on   # the head on int8 rows or not
"""

from __future__ import annotations

import argparse
import statistics

from mars_cli.evaluation.suites import load_suite
from mars_cli.options import DecodingOptions
from mars_cli.session import Session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--suites", default="chat,code")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--verify", default="strict",
                        help="the drafting sessions' rules, comma-separated: strict, mars (at the shipped profile)")
    parser.add_argument("--int8-head", default="auto",
                        help="the drafting sessions' --int8-head, comma-separated: with two or more, each rule's "
                             "default runs once per setting (named default-int8-on, default-mars-int8-off, ...)")
    parser.add_argument("--chooser-off", action="store_true", help="the default never drafts (no probes)")
    parser.add_argument("--verbose", action="store_true", help="one line per prompt and method")
    args = parser.parse_args()
    rules = args.verify.split(",")
    if not set(rules) <= {"strict", "mars"}:
        parser.error(f"--verify {args.verify}: expected strict, mars or both")
    int8_settings = args.int8_head.split(",")
    if not set(int8_settings) <= {"auto", "on", "off"}:
        parser.error(f"--int8-head {args.int8_head}: expected auto, on or off, comma-separated")

    plain = Session(DecodingOptions.of(dtype=args.dtype, draft="none", max_new_tokens=args.max_new_tokens))
    sessions = {"plain": plain}
    for rule in rules:  # "default": the default with strict verification; "default-mars" with MARS
        for int8 in int8_settings:
            name = "default" if rule == "strict" else f"default-{rule}"
            name += f"-int8-{int8}" if len(int8_settings) > 1 else ""
            sessions[name] = Session(DecodingOptions.of(dtype=args.dtype, draft="auto", num_draft="auto", verify=rule,
                                                        int8_head=int8, max_new_tokens=args.max_new_tokens),
                                     target=plain.target)
    drafting = [name for name in sessions if name != "plain"]
    choosers = {name: sessions[name].draft_length() for name in drafting}
    for chooser in choosers.values() if args.chooser_off else ():
        if chooser is not None:
            chooser.PROBE_EVERY = 10 ** 9  # never due
            chooser.draft_cost_ms = lambda k: 1e9  # drafting never pays: plain rounds, with all the chooser's work
    prompts = [plain.encode(sample.turns[0]) for suite in args.suites.split(",")
               for sample in load_suite(suite).samples[: args.limit]]
    totals = {name: {"wall": 0.0, "tokens": 0, "rounds": 0, "levels": 0, "phases": {}} for name in sessions}
    per_round: dict[str, list[float]] = {name: [] for name in sessions}
    names = list(sessions)
    for repeat in range(args.repeats):
        for index, prompt in enumerate(prompts):
            turn = (index + repeat) % len(names)  # each session goes first in turn
            for name in names[turn:] + names[:turn]:
                stats = sessions[name].run(prompt).stats
                total = totals[name]
                total["wall"] += stats.wall_s
                total["tokens"] += stats.new_tokens
                total["rounds"] += stats.rounds
                total["levels"] += sum(stats.drafted_at)  # each round's tree depth
                for phase, seconds in stats.phase_s.items():
                    total["phases"][phase] = total["phases"].get(phase, 0.0) + seconds
                per_round[name].append(1000 * stats.wall_s / stats.rounds)
                if args.verbose:
                    print(f"  {name} prompt {index}: {stats.rounds} rounds, {per_round[name][-1]:.2f} ms a round, "
                          f"{stats.drafted} drafted")
    for name, total in totals.items():
        phases = {phase: round(1000 * seconds / total["rounds"], 2) for phase, seconds in total["phases"].items()}
        print(f"{name}: {total['tokens'] / total['wall']:.2f} tok/s, {1000 * total['wall'] / total['rounds']:.2f} "
              f"ms a round over {total['rounds']} rounds (tau {total['tokens'] / total['rounds']:.2f}, "
              f"mean depth {total['levels'] / total['rounds']:.2f}); ms a round by phase {phases}")
    rate = {name: t["tokens"] / t["wall"] for name, t in totals.items()}
    for name in drafting:
        pairs = [b / a for a, b in zip(per_round["plain"], per_round[name])]
        print(f"{name} vs plain: {rate[name] / rate['plain']:.3f}x tokens/s; a round costs "
              f"{statistics.median(pairs):.4f}x a plain one (median over prompts); head on int8 rows: "
              f"{sessions[name].int8_head.used}")
        chooser = choosers[name]
        if chooser is not None:
            print(f"  chooser: acceptance {[round(a, 2) for a in chooser.acceptance()[:4]]}, rounds that drafted "
                  f"{chooser.proposed_rounds}, drafting lengths timed {sorted(chooser.time_by_k)}, live ms by width "
                  f"{ {w: round(chooser.costs.cost(w), 1) for w in sorted(chooser.costs.timed)} }")


if __name__ == "__main__":
    main()
