"""One-liners on a busy machine with a cold tuning cache: auto against the same choices given explicitly.

Do the measured choices cost anything after the first call? (issue 56's busy-machine goal)

A second job runs a CPU-bound loop on every core for the whole run. The cache holds the converted
model but no tuning choice (a first day, or after a drift). After one first call, the same
one-liner runs CALLS more times with every choice `auto`, interleaved with CALLS runs that give
every choice explicitly (the dtype, packing, int8 head and draft shape the first call chose, and a
fixed draft length: nothing left to measure). Reported: the wall time of each call, the ratio
auto / explicit, tracebacks, and whether any tuning entry was written after the first call (a
measurement taken twice would be).

    python benchmarks/bench_busy.py --out benchmarks/results/busy-machine/epyc-avx512bf16.json
    python benchmarks/bench_busy.py --revision 7be3e65 --out ...  # the same, for an older revision
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from mars_cli.paths import cache_dir  # noqa: E402
from mars_cli.tuning.machine import busy_reason, machine_facts, usable_cores  # noqa: E402

PROMPT = "Hi"
SPIN = "while True: pass"


def mars(python_path: Path, cache: Path, args: list[str]) -> dict:
    """One `mars generate` call in a fresh process: its wall time, JSON output and stderr. It runs
    in the cache's folder: run from the checkout, the checkout's own mars_cli would shadow
    PYTHONPATH's (an older revision's)."""
    env = {**os.environ, "MARS_CACHE": str(cache), "PYTHONPATH": str(python_path), "MARS_SERVER": "off"}  # each call its own process
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", "from mars_cli.cli import main; main()", "generate", PROMPT,
                           "--max-new-tokens", "8", "--json", *args], env=env, capture_output=True, text=True,
                          timeout=900, cwd=cache)
    wall = time.perf_counter() - started
    output = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None
    return {"args": args, "wall_s": wall, "rc": done.returncode, "traceback": "Traceback" in done.stderr,
            "notes": [line for line in done.stderr.splitlines() if line.startswith("mars:")],
            "config": None if output is None else output["config"],
            "startup_s": None if output is None else output["stats"].get("startup_s"),
            "load_average": os.getloadavg()[0]}


def explicit(config: dict) -> list[str]:
    """Flags that give every choice the first call made, and a fixed draft length."""
    flags = ["--dtype", config["dtype"], "--packed-weights", "on" if config["packed_weights"] else "off",
             "--int8-head", "on" if config["int8_head"] else "off", "--num-draft", "4"]
    if config["tree_topk"] > 1:
        flags += ["--draft-topk", str(config["tree_topk"]), "--draft-tokens", str(config["tree_tokens"])]
    else:
        flags += ["--draft-topk", "1"]
    return flags


def entries(cache: Path) -> dict[str, float]:
    """Every tuning entry and when it was last written."""
    return {str(path.relative_to(cache)): path.stat().st_mtime for path in cache.glob("*/*.json")
            if path.parts[-2] != "models"}


def source(revision: str | None, into: Path) -> Path:
    """The folder whose mars_cli runs: this checkout, or `revision`'s extracted with git archive."""
    if revision is None:
        return REPO
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "mars_cli"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5, help="one-liners of each kind after the first")
    parser.add_argument("--revision", default=None, help="run this git revision's mars_cli instead of the checkout's")
    parser.add_argument("--settle-s", type=float, default=30.0, help="most seconds to wait for the load to show")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    models = cache_dir() / "models"
    if not models.is_dir():
        sys.exit(f"no converted model under {models}: run `mars generate hi` once first")
    scratch = Path(tempfile.mkdtemp(prefix="mars-busy-"))
    cache = scratch / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(models)
    python_path = source(args.revision, scratch)
    cores = usable_cores()
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(cores)]
    try:
        waited = time.monotonic()
        while busy_reason() is None and time.monotonic() - waited < args.settle_s:  # the spinners show
            time.sleep(1)
        first = mars(python_path, cache, [])
        print(f"first call: {first['wall_s']:.1f} s, rc {first['rc']}", file=sys.stderr, flush=True)
        if first["config"] is None:
            sys.exit(f"the first call failed: {first['notes']}")
        written = entries(cache)
        fixed = explicit(first["config"])
        calls: dict[str, list[dict]] = {"auto": [], "explicit": []}
        for index in range(args.calls):
            for kind in (("auto", "explicit") if index % 2 == 0 else ("explicit", "auto")):
                calls[kind].append(mars(python_path, cache, [] if kind == "auto" else fixed))
            print(f"pair {index}: auto {calls['auto'][-1]['wall_s']:.1f} s, explicit "
                  f"{calls['explicit'][-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
        rewritten = sorted(name for name, at in entries(cache).items() if written.get(name) != at)
    finally:
        for spinner in spinners:
            spinner.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    auto_s = sum(call["wall_s"] for call in calls["auto"])
    explicit_s = sum(call["wall_s"] for call in calls["explicit"])
    result = {
        "command": " ".join(["python", *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M"),
        "revision": args.revision or "checkout", "machine": machine_facts(), "cores": cores,
        "first_call": first, "calls": calls, "explicit_flags": fixed,
        "auto_over_explicit": auto_s / explicit_s,
        "tracebacks": sum(call["traceback"] for call in [first, *calls["auto"], *calls["explicit"]]),
        "entries_written_after_the_first_call": rewritten,
    }
    print(f"{result['machine']['cpu']}: auto / explicit = {result['auto_over_explicit']:.3f} over {args.calls} "
          f"one-liners each; first call {first['wall_s']:.1f} s; tracebacks {result['tracebacks']}; entries "
          f"written after the first call: {rewritten or 'none'}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
