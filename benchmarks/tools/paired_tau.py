"""Paired comparison of two drafting methods' tau on the same eval samples, with a bootstrap interval.

A head step is judged on the held-out suites, where one sample's tau swings by about 0.3 between
two heads that are equally good on average (step 16, docs/head.md): on 24 samples a difference
under about 0.1 is noise. This pairs each sample's two runs (the same prompt, so the same text
to draft against), and resamples samples to give a 90% interval for the pooled tau's change.

Each side is `FILE:METHOD`, a `mars eval` samples.jsonl (or the samples.jsonl.gz a run kept under
benchmarks/results/ is stored as) and a method name in it (a unique substring is enough), so two
runs of the same suites can be compared; here the step-13 head against the step-18 head:

    python benchmarks/tools/paired_tau.py benchmarks/results/eval-lookup-off/samples.jsonl.gz:head+4x16 \
        benchmarks/results/eval-head-gpu/samples.jsonl.gz:g3+4x16
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path

from mars_cli.calibration.decision import percentile_interval

Runs = dict[tuple[str, str], tuple[int, int]]  # (suite, sample id) -> (new tokens, rounds)


def fail(message: str) -> None:
    """Bad input: one line on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def read_side(spec: str) -> tuple[str, Runs]:
    """The runs of the one method in FILE whose name contains METHOD."""
    path, _, wanted = spec.rpartition(":")
    if not path or not Path(path).is_file():
        fail(f"{spec}: expected FILE:METHOD with FILE a samples.jsonl of `mars eval`")
    text = gzip.decompress(Path(path).read_bytes()).decode() if path.endswith(".gz") else Path(path).read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    names = sorted({row["method"] for row in rows if wanted in row["method"]})
    if len(names) != 1:
        fail(f"{spec}: {len(names)} methods match {wanted!r} ({', '.join(names) or 'none'})")
    runs = {(row["suite"], row["sample_id"]): (row["new_tokens"], row["rounds"])
            for row in rows if row["method"] == names[0]}
    return names[0], runs


def pooled_tau(runs: list[tuple[int, int]]) -> float:
    """Tokens per round over all runs (what `mars eval` reports as tau)."""
    return sum(tokens for tokens, _ in runs) / max(1, sum(rounds for _, rounds in runs))


def bootstrap_interval(pairs: list[tuple[tuple[int, int], tuple[int, int]]], draws: int,
                       rng: random.Random) -> list[float]:
    """5th and 95th percentiles of the pooled tau's change over resampled sample sets."""
    changes = []
    for _ in range(draws):
        chosen = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        changes.append(pooled_tau([new for _, new in chosen]) - pooled_tau([base for base, _ in chosen]))
    return percentile_interval(changes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="FILE:METHOD, the reference")
    parser.add_argument("new", help="FILE:METHOD, the method compared with it")
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    base_name, base = read_side(args.base)
    new_name, new = read_side(args.new)
    shared = sorted(set(base) & set(new))
    if not shared:
        fail("the two sides share no (suite, sample) pair")
    rng = random.Random(args.seed)
    print(f"base: {base_name}\nnew:  {new_name}")
    print("| suite | samples | tau base | tau new | change | 90% interval | samples up / down |")
    print("|---|---|---|---|---|---|---|")
    for suite in sorted({s for s, _ in shared}) + ["all"]:
        keys = [k for k in shared if suite in ("all", k[0])]
        pairs = [(base[k], new[k]) for k in keys]
        before, after = pooled_tau([b for b, _ in pairs]), pooled_tau([n for _, n in pairs])
        low, high = bootstrap_interval(pairs, args.draws, rng)
        per_sample = [n[0] / n[1] - b[0] / b[1] for b, n in pairs]
        up, down = sum(d > 0 for d in per_sample), sum(d < 0 for d in per_sample)
        print(f"| {suite} | {len(keys)} | {before:.3f} | {after:.3f} | {after - before:+.3f} | "
              f"{low:+.3f} to {high:+.3f} | {up} / {down} |")


if __name__ == "__main__":
    main()
