"""Held-out acceptance of draft heads on a study's held-out answers, split by where the prompts
came from: the large set's (prompt index below --split) and the pooled-in set's (at or above it),
each from every position and in decoding's rounds, chains of k = 4 (issue 27, step 12).

    python benchmarks/tools/held_out_by_source.py --generations gen-step12.jsonl \
        --head s11=OLD_HEAD_DIR --head s12=mars_cli/heads/smollm2-135m --out held-out-by-source.json

The features are the study's cached ones (benchmarks/head_scaling.py over the same generations).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from head_scaling import study_folder  # noqa: E402

from mars_cli.head.data import extract_features, read_generations  # noqa: E402
from mars_cli.head.drafter import load_head  # noqa: E402
from mars_cli.head.train import feature_layers, held_out_acceptance, split  # noqa: E402
from mars_cli.models import load_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generations", type=Path, required=True)
    parser.add_argument("--head", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--split", type=int, default=10_000, help="first prompt index of the pooled-in set")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    target = load_model("smollm2-135m", device="cpu", dtype="float32")
    sequences = sorted(read_generations(args.generations).values(), key=lambda s: s.index)
    held = [s for s in split(sequences)[1] if s.mode == "greedy"]
    features = extract_features(target, sequences, study_folder(target, sequences) / "features", 16, None,
                                feature_layers("eagle3", target.model))
    groups = {"large": [s for s in held if s.index < args.split], "pooled-in": [s for s in held if s.index >= args.split]}
    results = {}
    for spec in args.head:
        name, _, folder = spec.partition("=")
        head = load_head(f"head:{folder}", target)
        for group, members in groups.items():
            figures = held_out_acceptance(head, members, features, 4, 512)
            results[f"{name}/{group}"] = {"answers": len(members), "tau": round(figures.tau, 3),
                                          "decoding_tau": round(figures.decoding_tau, 3),
                                          "per_position": [round(p, 3) for p in figures.per_position]}
            print(name, group, results[f"{name}/{group}"], flush=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
