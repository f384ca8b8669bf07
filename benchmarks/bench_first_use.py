"""What a newcomer gets: on an empty cache, the README's commands in order, each a process of its
own (MARS_SERVER=off: the decode speed, not the server's start-up), and beside every default
one-liner the same prompt with `--draft none` in the same state:

  1. `make demo`'s generate (the README's prompt, 64 tokens, --stats)
  2. five default one-liners on other prompts
  3. `mars tune`
  4. five more default one-liners

Each row: tokens/s, the dtype, whether that choice is provisional, tau, and the ratio to plain
decoding. `--busy` keeps one core busy (a spinning process) throughout, as a machine with other
work on it. Timings never decide anything here: the table is the measurement.

    python benchmarks/bench_first_use.py [--busy] [--new-tokens 64] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from interleaved import REPO, held_out_prompts  # noqa: E402

DEMO_PROMPT = "Explain in two sentences why the sky is blue."  # the Makefile's PROMPT
MARS = [str(REPO / ".venv" / "bin" / "mars")]


def generate(prompt: str, environment: dict, new_tokens: int, *extra: str) -> dict:
    """One `mars generate --json` process: its JSON, and its wall seconds."""
    start = time.perf_counter()
    done = subprocess.run(MARS + ["generate", prompt, "-n", str(new_tokens), "--json", *extra], capture_output=True,
                          text=True, env=environment, timeout=900)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"mars generate failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    report = json.loads(done.stdout)
    tuning = report.get("tuning") or {}
    dtype_entry = tuning.get("dtype") or {}
    return {"tokens_per_s": report["stats"]["tokens_per_s"], "tau": report["stats"]["mean_accepted"],
            "dtype": report["config"]["dtype"], "provisional": dtype_entry.get("provisional"),
            "shape": f"{report['config']['tree_topk']} x {report['config']['tree_tokens']}", "wall_s": wall}


def step(label: str, prompt: str, environment: dict, new_tokens: int) -> dict:
    default = generate(prompt, environment, new_tokens)
    plain = generate(prompt, environment, new_tokens, "--draft", "none")
    row = {"step": label, **default, "plain_tokens_per_s": plain["tokens_per_s"], "plain_dtype": plain["dtype"],
           "x_plain": default["tokens_per_s"] / plain["tokens_per_s"] if plain["tokens_per_s"] else None}
    print(f"{label:10s} {default['tokens_per_s']:7.1f} tok/s  {default['dtype']:8s} "
          f"{'provisional' if default['provisional'] else 'settled':11s} tau {default['tau']:.2f}  "
          f"plain {plain['tokens_per_s']:7.1f} ({plain['dtype']})  x plain {row['x_plain']:.2f}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--busy", action="store_true", help="keep one core busy throughout")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="mars-first-use-"))
    from mars_cli.decoding import kernels

    # an empty cache, but the kernels `make setup` built (a newcomer's `make demo` builds them first)
    environment = {**os.environ, "MARS_CACHE": str(cache), "MARS_SERVER": "off",
                   "MARS_KERNELS": os.environ.get("MARS_KERNELS") or str(kernels.build_dir().parent)}
    environment.pop("CI", None)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    prompts = held_out_prompts(10)
    rows = []
    try:
        rows.append(step("demo", DEMO_PROMPT, environment, args.new_tokens))
        for i in range(5):
            rows.append(step(f"before {i + 1}", prompts[i], environment, args.new_tokens))
        start = time.perf_counter()
        subprocess.run(MARS + ["tune"], env=environment, capture_output=True, text=True, timeout=1800, check=True)
        tune_s = time.perf_counter() - start
        print(f"mars tune  {tune_s:.0f} s", flush=True)
        for i in range(5):
            rows.append(step(f"after {i + 1}", prompts[5 + i], environment, args.new_tokens))
    finally:
        if spinner is not None:
            spinner.kill()
    if args.out:
        from mars_cli.tuning.machine import cpu_name

        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"cpu": cpu_name(), "busy": args.busy, "new_tokens": args.new_tokens,
                                        "tune_s": tune_s, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
