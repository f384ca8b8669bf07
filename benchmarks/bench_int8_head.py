"""What int8 rows save a bfloat16 draft head's drafting (issue 27: cheaper drafting).

    python benchmarks/bench_int8_head.py --runs 3 --out benchmarks/results/int8-head-cost.json
    python benchmarks/bench_int8_head.py --dtype float32 --runs 3 --out benchmarks/results/int8-head-cost-f32.json

The shipped head for the embedded target, both in `--dtype` (bfloat16 or float32), timed by `--int8-head auto`'s own
measurement (mars_cli/tuning/int8.py: a round's drafting, 3 true pairs then 3 levels of 4, each
scored, each block after a target step that evicts the head's weights; the head's own weights and
int8 rows interleaved), `--runs` times against the head's dense linears and, in bfloat16,
against its packed ones (what a session on a CPU that packs runs). Timings only: acceptance with int8 rows comes from
`mars eval` (docs/head.md, "Int8 weights").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from mars_cli.decoding import packing
from mars_cli.tuning import int8
from mars_cli.tuning.machine import machine_facts
from mars_cli.head.drafter import load_head
from mars_cli.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15, help="blocks of each variant per run")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    int8.REPEATS = args.repeats
    target = load_model("smollm2-135m", device="cpu", dtype=args.dtype)
    heads = {"dense": load_head("head", target), "packed": load_head("head", target)}
    if packing.problem(heads["packed"]) is not None:
        del heads["packed"]
    else:
        packing.install(heads["packed"])
    rows = []
    for run in range(args.runs):
        for side, head in heads.items():
            choice = int8.measure(head, target, int8.int8_key(head, target))
            rows.append({"run": run, "against": side, "ms_full": round(choice.ms_full, 3),
                         "ms_int8": round(choice.ms_int8, 3), "ratio": round(choice.ms_int8 / choice.ms_full, 3)})
    machine = {**machine_facts(), "dtype": args.dtype}
    print(json.dumps(machine))
    print("| run | the head's own linears | own (ms) | int8 rows (ms) | int8 / own |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['run'] + 1} | {row['against']} | {row['ms_full']:.2f} | {row['ms_int8']:.2f} | {row['ratio']:.3f} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine, "repeats": args.repeats, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
