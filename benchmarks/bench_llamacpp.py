"""Side by side on one GGUF: llama-bench, our `--engine llama.cpp` and our transformers engine.

llama.cpp's own llama-bench, our `--engine llama.cpp` (plain, the default, MARS at 0.9 and 0.97)
and our transformers engine (plain and default, under `--dtype auto`, `q4` and `float32`), tokens/s
on the same held-out prompts, methods interleaved prompt by prompt. Run in .venv-llamacpp:

    bash benchmarks/tools/build_llama_bench.sh          # llama-bench, same llama.cpp and flags
    .venv-llamacpp/bin/python benchmarks/bench_llamacpp.py --out benchmarks/results/llamacpp/CPU.json

llama-bench runs after each round of prompts (interleaved, as our methods are among themselves).
Every run decodes NEW_TOKENS tokens past EOS (as llama-bench's -n does); tokens/s is new tokens
over the decode's wall time after the prefill (llama-bench's tg excludes prompt processing too).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interleaved import REPO, held_out_prompts, run_methods, summary  # noqa: E402

from mars_cli.tuning.machine import cpu_name  # noqa: E402

NEW_TOKENS = 128
METHODS = {  # name -> options (flat names)
    "llama.cpp plain": {"engine": "llama.cpp", "draft": "none"},
    "llama.cpp default": {"engine": "llama.cpp", "draft": "auto", "num_draft": "auto"},
    "llama.cpp mars 0.9": {"engine": "llama.cpp", "draft": "auto", "num_draft": "auto", "verify": "mars",
                           "threshold": 0.9},
    "llama.cpp mars 0.97": {"engine": "llama.cpp", "draft": "auto", "num_draft": "auto", "verify": "mars",
                            "threshold": 0.97},
    "transformers plain": {"draft": "none"},
    "transformers default": {"draft": "auto", "num_draft": "auto"},
    "transformers mars 0.9": {"draft": "auto", "num_draft": "auto", "verify": "mars", "threshold": 0.9},
    "transformers q4 plain": {"draft": "none", "dtype": "q4"},
    "transformers q4 default": {"draft": "auto", "num_draft": "auto", "dtype": "q4"},
    "transformers q4a8 plain": {"draft": "none", "dtype": "q4a8"},
    "transformers q4a8 default": {"draft": "auto", "num_draft": "auto", "dtype": "q4a8"},
    "transformers float32 plain": {"draft": "none", "dtype": "float32"},
    "transformers float32 default": {"draft": "auto", "num_draft": "auto", "dtype": "float32"},
}


def llama_bench(binary: str, gguf: str, threads: int, repeats: int) -> dict:
    """llama-bench's plain generation (-p 0 -n NEW_TOKENS) on the GGUF: mean and sd tokens/s."""
    done = subprocess.run([binary, "-m", gguf, "-p", "0", "-n", str(NEW_TOKENS), "-t", str(threads), "-r",
                           str(repeats), "-o", "json"], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    row = json.loads(done.stdout)[0]
    return {"tokens_per_s": row["avg_ts"], "sd": row["stddev_ts"], "build": row.get("build_commit"),
            "cpu": row.get("cpu_info"), "threads": row.get("n_threads"), "type": row.get("model_type")}


def pooled_bench(runs: list[dict]) -> dict | None:
    """The llama-bench runs interleaved with ours: their mean tokens/s, each run's, and its details."""
    rates = [run["tokens_per_s"] for run in runs if "tokens_per_s" in run]
    if not rates:
        return runs[0] if runs else None
    return {**runs[0], "tokens_per_s": statistics.mean(rates), "sd": statistics.stdev(rates) if len(rates) > 1 else 0.0,
            "runs": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"), help="llama-bench's path")
    parser.add_argument("--repeats", type=int, default=2, help="llama-bench's -r, after each round of prompts")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    methods = {name: METHODS[name] for name in args.methods.split(",")}
    bench_runs: list[dict] = []
    state: dict = {}

    def between() -> None:  # llama-bench after each round: a machine's speed drifts over minutes
        if args.llama_bench and state.get("gguf"):
            bench_runs.append(llama_bench(args.llama_bench, state["gguf"], state["threads"], args.repeats))

    from mars_cli.llamacpp.target import gguf_file

    state["gguf"] = str(gguf_file(args.target)) if any(m.get("engine") == "llama.cpp" for m in methods.values()) \
        else None
    state["threads"] = len(os.sched_getaffinity(0))
    sessions, runs = run_methods(methods, held_out_prompts(args.prompts), NEW_TOKENS, {"target": args.target},
                                 between)
    llama = next((s for s in sessions.values() if s.options.model.engine == "llama.cpp"), None)
    if llama is not None and llama.scorer.threads != state["threads"]:
        note = f"ours decoded with {llama.scorer.threads} threads (measured), llama-bench with {state['threads']}"
        print(note)
    bench = pooled_bench(bench_runs)
    table = {}
    for name, rows in runs.items():
        table[name] = {**summary(rows), "config": {k: v for k, v in sessions[name].config().items()
                                                     if k in ("engine", "drafter", "tree_topk", "tree_tokens", "dtype",
                                                              "threads", "verify", "threshold", "num_draft")}}
    plain = table.get("llama.cpp plain", {}).get("tokens_per_s")
    for row in table.values():
        row["x_llamacpp_plain"] = row["tokens_per_s"] / plain if plain else None
        row["x_llama_bench"] = row["tokens_per_s"] / bench["tokens_per_s"] if bench and "tokens_per_s" in bench \
            else None
    same = {name: all(a["tokens"] == b["tokens"] for a, b in zip(runs[name], runs["llama.cpp plain"]))
            for name in runs if name.startswith("llama.cpp") and "mars" not in name and "llama.cpp plain" in runs}
    record = {"cpu": cpu_name(), "machine": platform.machine(), "target": args.target, "gguf": state["gguf"],
              "new_tokens": NEW_TOKENS, "prompts": args.prompts, "llama_bench": bench, "table": table,
              "strict_same_tokens_as_plain": same, "date": time.strftime("%Y-%m-%d"),
              "build_flags": subprocess.run([sys.executable, str(REPO / "mars_cli/llamacpp/build_flags.py")],
                                            capture_output=True, text=True).stdout.strip() or "native"}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    for name, row in table.items():
        print(f"{name:24s} {row['tokens_per_s']:7.1f} tok/s  tau {row['tau']:.2f}  "
              f"x plain {row['x_llamacpp_plain'] or 0:.2f}  x llama-bench {row['x_llama_bench'] or 0:.2f}")
    if bench:
        print(f"llama-bench tg{NEW_TOKENS}: {bench}")


if __name__ == "__main__":
    main()
