"""Packed bfloat16 weights (mars_cli/packed_linear.py) against unpacked, in real decoding.

Two bfloat16 copies of the embedded model in one process, one with its linears (and its draft
head's) packed, one without; for each prompt of the decoding benchmark and each method (plain
decoding; the default `mars generate`: head, tree shape and draft length from the cost model)
the two alternate A B / B A, repeated. Reported: tokens/s per variant and method, the ratio, and
whether the two emitted the same tokens (they must: packing changes no output). Also float32
plain decoding, interleaved the same way, as the yardstick `--dtype auto` compares against.

    python benchmarks/bench_packed.py --out benchmarks/results/packed.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn

from bench_decoding import PROMPTS
from mars_cli.decoding.cost import _cpu_matrix_flags, _cpu_name
from mars_cli.models import load_model
from mars_cli.options import DecodingOptions
from mars_cli.packed_linear import PackedLinear
from mars_cli.session import Session

METHODS = {"plain": {"draft": "none"}, "default": {"draft": "auto", "num_draft": "auto"}}


def unpack(model: nn.Module) -> int:
    """Every PackedLinear back to a plain nn.Linear over the same parameters."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                plain = nn.Linear.__new__(nn.Linear)
                plain.__dict__.update({k: v for k, v in child.__dict__.items() if k != "_packed"})
                setattr(parent, name, plain)
                swapped += 1
    return swapped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    targets = {"packed": load_model("smollm2-135m", dtype="bfloat16"),
               "unpacked": load_model("smollm2-135m", dtype="bfloat16"),
               "float32": load_model("smollm2-135m", dtype="float32")}
    unpack(targets["unpacked"].model)
    sessions = {}
    for method, options in METHODS.items():
        for variant, target in targets.items():
            if variant == "float32" and method != "plain":
                continue
            dtype = "float32" if variant == "float32" else "bfloat16"
            session = Session(DecodingOptions.of(max_new_tokens=args.max_new_tokens, dtype=dtype, **options), target=target)
            if variant == "unpacked" and hasattr(session.drafter, "head"):
                unpack(session.drafter.head)
            sessions[(method, variant)] = session
    for session in sessions.values():  # warm-up: kernels, cost curves, the chooser's first rounds
        session.run(PROMPTS["chat"], settings=None)
    totals = {key: [0, 0.0, 0] for key in sessions}  # tokens, seconds, rounds
    outputs: dict[tuple, list[list[int]]] = {key: [] for key in sessions}
    order = list(sessions)
    for repeat in range(args.repeats):
        for index, prompt in enumerate(PROMPTS.values()):
            turn = order if (repeat + index) % 2 == 0 else order[::-1]
            for key in turn:
                session = sessions[key]
                ids = session.encode(prompt)
                start = time.perf_counter()
                result = session.run(ids)
                elapsed = time.perf_counter() - start
                totals[key][0] += len(result.token_ids)
                totals[key][1] += elapsed
                totals[key][2] += result.stats.rounds
                if repeat == 0:
                    outputs[key].append(result.token_ids)
    rows = {f"{method} {variant}": {"tokens_per_s": tokens / seconds, "tau": tokens / rounds, "tokens": tokens}
            for (method, variant), (tokens, seconds, rounds) in totals.items()}
    same = {method: outputs[(method, "packed")] == outputs[(method, "unpacked")] for method in METHODS}
    base = rows["plain float32"]["tokens_per_s"]
    for name, row in rows.items():
        row["vs_float32_plain"] = row["tokens_per_s"] / base
        print(f"{name:18s} {row['tokens_per_s']:6.2f} tok/s  tau {row['tau']:.2f}  {row['vs_float32_plain']:.3f}x float32 plain")
    for method in METHODS:
        ratio = rows[f"{method} packed"]["tokens_per_s"] / rows[f"{method} unpacked"]["tokens_per_s"]
        print(f"{method}: packed / unpacked {ratio:.3f}, same tokens: {same[method]}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "device": _cpu_name(), "matrix_flags": _cpu_matrix_flags(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
            "rows": rows, "same_tokens": same}, indent=1) + "\n")


if __name__ == "__main__":
    main()
