"""One machine's row of the cross-machine record (docs/benchmarks.md, "Across machines").

Every automatic choice must come from a measurement on the machine it runs on, so each machine
kind met gets a row: the CPU (or GPU) and the instruction sets matrix kernels use, a plain step
in each dtype and the one `--dtype auto` chose (`mars profile --dtypes`), and the default `mars
generate` (`--draft auto --num-draft auto`) against plain decoding, interleaved per sample by
`mars eval`, in the chosen dtype and in the other one. Each command's output is kept under
`--out`; the row is printed as Markdown.

    python benchmarks/machine_record.py --out benchmarks/results/machine-<name>

Takes about 10 minutes on a 2-core CPU (16 samples, 128 tokens, two dtypes). Run it on a quiet
machine: nothing else heavy at the same time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from mars_cli.decoding.cost import _cpu_matrix_flags, _cpu_name

OTHER = {"float32": "bfloat16", "bfloat16": "float32", "float16": "float32"}


def mars(arguments: list[str], out: Path, name: str) -> dict:
    """Run `mars ARGUMENTS --json`, keep stdout and stderr as NAME.json / NAME.err, return the JSON."""
    command = [sys.executable, "-m", "mars_cli.cli", *arguments, "--json"]
    with open(out / f"{name}.json", "w") as stdout, open(out / f"{name}.err", "w") as stderr:
        subprocess.run(command, stdout=stdout, stderr=stderr, check=True)
    return json.loads((out / f"{name}.json").read_text())


def default_vs_plain(results: dict) -> tuple[float, float, float]:
    """(plain tokens/s, default's speedup over plain, default's tau) over all suites."""
    rows = {row["method"]: row for row in results["table"]["all"]}
    return rows["vanilla"]["tokens_per_s"], rows["strict"]["speedup"], rows["strict"]["tau"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=8, help="samples per suite (chat, code)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    profile = mars(["profile", "--dtypes", "-n", "16"], args.out, "dtypes")
    measured = profile["dtypes"]
    chosen = measured["chosen"]
    steps = {c["dtype"]: c["ms_per_step"] for c in measured["candidates"]}
    evals = {}
    for dtype in (chosen, OTHER[chosen]):
        shutil.rmtree(args.out / f"eval-{dtype}", ignore_errors=True)  # a rerun replaces its own earlier run
        evals[dtype] = default_vs_plain(mars(
            ["eval", "--suite", "chat,code", "--limit", str(args.limit), "--methods", "vanilla,strict",
             "--draft", "auto", "--dtype", dtype, "--max-new-tokens", str(args.max_new_tokens),
             "--out", str(args.out / f"eval-{dtype}")], args.out, f"eval-{dtype}"))
    device = "cuda:" + torch.cuda.get_device_name() if torch.cuda.is_available() else _cpu_name()
    record = {
        "device": device, "matrix_flags": _cpu_matrix_flags(), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "ms_per_plain_step": steps, "chosen": chosen,
        "default_vs_plain": {dtype: {"plain_tokens_per_s": plain, "speedup": speedup, "tau": tau}
                             for dtype, (plain, speedup, tau) in evals.items()},
    }
    (args.out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    step = " / ".join(f"{steps[d]:.1f}" if steps.get(d) else "-" for d in ("float32", "bfloat16"))
    speedups = ", ".join(f"{d} {s:.3f}x (tau {t:.2f}, plain {p:.1f} tok/s)" for d, (p, s, t) in evals.items())
    print(f"| {device} | {' '.join(record['matrix_flags'])} | {record['threads']} | {record['torch']} | {step} | "
          f"{chosen} | {speedups} |")


if __name__ == "__main__":
    main()
