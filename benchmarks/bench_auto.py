"""The default `mars generate` against `mars generate --draft none`, each in the dtype of its choice.

`mars eval` runs every method on one loaded target, so all of them in one dtype; but `--dtype
auto` chooses for the way a session decodes (tuning/dtype.py): a session that drafts may run in
bfloat16 where plain decoding runs in float32. This benchmark holds one target per dtype and runs
plain decoding and the default (the draft head, tree shape and draft length from the cost model)
in each, methods rotating per sample (A B C D / D C B A), on the eval suites' first samples
(first turns). Reported: tokens/s, tau and the ratio to the fastest plain decoding, and which dtype
`--dtype auto` chooses here for each kind of session (measured, or read from the cache).
`--packed-weights auto,off` also holds a target per packing mode (mars_cli/packing.py) and names
each row by it: packed against dense linears, every other setting alike, interleaved.
`--draft-lookup on,off` likewise runs the default with and without prompt lookup's branch grafted
on its trees (the first mode is the one the `auto` ratio reads).

    python benchmarks/bench_auto.py --suites chat,code --limit 8 --out benchmarks/results/auto-<machine>.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from mars_cli.tuning import dtype as dtype_choice
from mars_cli.tuning.machine import cpu_matrix_flags as _cpu_matrix_flags, cpu_name as _cpu_name
from mars_cli.evaluation.suites import load_suite
from mars_cli.models import load_model
from mars_cli.options import DecodingOptions
from mars_cli.session import Session

KINDS = {"plain": {"draft": "none"}, "default": {"draft": "auto", "num_draft": "auto"}}


def write_record(path: Path, **fields: object) -> None:
    """The machine (CPU, matrix flags, threads, torch) and `fields`, as JSON at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": _cpu_name(), "matrix_flags": _cpu_matrix_flags(),
                                "threads": torch.get_num_threads(), "torch": torch.__version__, **fields},
                               indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default="chat,code")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--packed-weights", default="auto", help="packing modes, comma-separated (auto, on, off)")
    parser.add_argument("--draft-lookup", default="on", help="the default's lookup modes, comma-separated (on, off)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    dtypes, modes, lookups = args.dtypes.split(","), args.packed_weights.split(","), args.draft_lookup.split(",")
    # a row's name: kind and dtype, and the packing mode when several are compared
    variants = {(dtype, mode): dtype if len(modes) == 1 else f"{dtype} packed:{mode}" for dtype in dtypes for mode in modes}
    targets = {variant: load_model("smollm2-135m", dtype=variant[0]) for variant in variants}
    kinds = {"plain": KINDS["plain"]} | {  # the default once per lookup mode; its first mode keeps the plain name
        "default" + ("" if index == 0 else f" lookup:{lookup}"): {**KINDS["default"], "draft_lookup": lookup}
        for index, lookup in enumerate(lookups)}
    sessions = {f"{kind} {label}": Session(DecodingOptions.of(max_new_tokens=args.max_new_tokens, dtype=dtype,
                                                             packed_weights=mode, **options), target=targets[dtype, mode])
                for kind, options in kinds.items() for (dtype, mode), label in variants.items()}
    reference = (targets["float32", modes[0]] if "float32" in dtypes and modes[0] == "off"
                 else load_model("smollm2-135m", dtype="float32"))
    chosen = {}
    for kind in KINDS:  # measured on (or read for) a float32 target, as `--dtype auto` does
        choice = dtype_choice.choose(reference, speculative=kind != "plain", packed=modes[0] != "off")
        chosen[kind] = {"dtype": choice.chosen, "cached": choice.provenance.cached, "candidates": [vars(c) for c in choice.candidates]}
    prompts = [sample.turns[0] for name in args.suites.split(",") for sample in load_suite(name, args.limit).samples]
    for session in sessions.values():  # warm-up: kernels, cost curves, the chooser's first rounds
        session.run(prompts[0])
    totals = {key: [0, 0.0, 0] for key in sessions}  # tokens, seconds, rounds
    order = list(sessions)
    for index, prompt in enumerate(prompts):
        for key in (order if index % 2 == 0 else order[::-1]):
            session = sessions[key]
            start = time.perf_counter()
            result = session.run(session.encode(prompt))
            totals[key][1] += time.perf_counter() - start
            totals[key][0] += len(result.token_ids)
            totals[key][2] += result.stats.rounds
    rows = {name: {"tokens_per_s": tokens / seconds, "tau": tokens / rounds, "packed": sessions[name].packing.packed}
            for name, (tokens, seconds, rounds) in totals.items()}
    fastest_plain = max(row["tokens_per_s"] for name, row in rows.items() if name.startswith("plain "))
    for name, row in rows.items():
        row["vs_fastest_plain"] = row["tokens_per_s"] / fastest_plain
        print(f"{name:32s} {row['tokens_per_s']:6.2f} tok/s  tau {row['tau']:.2f}  {row['vs_fastest_plain']:.3f}x the "
              f"fastest plain{'  (packed)' if row['packed'] else ''}")
    auto_ratio = None  # the default against plain decoding, each in the dtype auto chooses for it (if run)
    if all((chosen[kind]["dtype"], modes[0]) in variants for kind in KINDS):
        auto_default = rows[f"default {variants[chosen['default']['dtype'], modes[0]]}"]["tokens_per_s"]
        auto_plain = rows[f"plain {variants[chosen['plain']['dtype'], modes[0]]}"]["tokens_per_s"]
        auto_ratio = auto_default / auto_plain
        print(f"--dtype auto chose {chosen['plain']['dtype']} for plain decoding, {chosen['default']['dtype']} for "
              f"the default: default / plain = {auto_ratio:.3f}x")
    if args.out:
        write_record(args.out, suites=args.suites, limit=args.limit, max_new_tokens=args.max_new_tokens,
                     packed_weights=modes, draft_lookup=lookups, rows=rows,
                     auto=chosen, auto_default_vs_auto_plain=auto_ratio)


if __name__ == "__main__":
    main()
