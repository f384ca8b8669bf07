"""One machine's row of the cross-machine record (docs/benchmarks.md, "Across machines").

Every automatic choice must come from a measurement on the machine it runs on, so each machine
kind met gets a row: the CPU (or GPU) and the instruction sets matrix kernels use, what `--dtype
auto` chooses for plain decoding and for a session that drafts (`mars profile --dtypes`, with
`--draft none` and with the default drafter: a plain step in each dtype, and for drafting each
dtype's estimated cost per token), and the default `mars generate` (`--draft auto --num-draft
auto`) against plain decoding in each dtype, all four interleaved per sample
(benchmarks/bench_auto.py: chat and code, first 8 each, 128 tokens). Each command's output is kept
under `--out`; the row is printed as Markdown.

    python benchmarks/machine_record.py --out benchmarks/results/machine-<name>

Takes about 10 minutes on a 2-core CPU. Run it on a quiet machine: nothing else heavy at the same time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(command: list[str], out: Path, name: str) -> str:
    """Run COMMAND, keep stdout and stderr as NAME.out / NAME.err, return stdout."""
    with open(out / f"{name}.out", "w") as stdout, open(out / f"{name}.err", "w") as stderr:
        subprocess.run(command, stdout=stdout, stderr=stderr, check=True)
    return (out / f"{name}.out").read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=8, help="samples per suite (chat, code)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    mars = [sys.executable, "-m", "mars_cli.cli"]
    choices = {}
    for kind, draft in (("plain", ["--draft", "none"]), ("speculative", [])):
        text = run([*mars, "profile", "--dtypes", "-n", "16", *draft, "--json"], args.out, f"dtypes-{kind}")
        choices[kind] = json.loads(text)["dtypes"]
    run([sys.executable, str(HERE / "bench_auto.py"), "--limit", str(args.limit), "--max-new-tokens",
         str(args.max_new_tokens), "--out", str(args.out / "auto.json")], args.out, "auto")
    auto = json.loads((args.out / "auto.json").read_text())
    rows = auto["rows"]
    steps = {c["dtype"]: c["ms_per_step"] for c in choices["plain"]["candidates"]}
    per_token = {c["dtype"]: c.get("ms_per_token") for c in choices["speculative"]["candidates"]}
    record = {"device": auto["device"], "matrix_flags": auto["matrix_flags"], "threads": auto["threads"],
              "torch": auto["torch"], "ms_per_plain_step": steps, "ms_per_token_estimated": per_token,
              "chosen": {kind: choice["chosen"] for kind, choice in choices.items()}, "bench_auto": rows,
              "default_vs_plain_auto": auto["auto_default_vs_auto_plain"]}
    (args.out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    cells = [f"{d}: plain {rows[f'plain {d}']['tokens_per_s']:.1f} tok/s, default {rows[f'default {d}']['tokens_per_s']:.1f} "
             f"(tau {rows[f'default {d}']['tau']:.2f})" for d in ("float32", "bfloat16")]
    print(f"| {record['device']} | {' '.join(record['matrix_flags'])} | {record['threads']} | {record['torch']} | "
          f"{record['chosen']['plain']} / {record['chosen']['speculative']} | {'; '.join(cells)} | "
          f"{record['default_vs_plain_auto']:.3f}x |")


if __name__ == "__main__":
    main()
