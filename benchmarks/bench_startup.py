"""Start-up, as a user meets it: one-liners as whole processes, interleaved, against
llama-cpp-python's own one-liner on the same GGUF.

    python benchmarks/bench_startup.py --repeats 5 --out benchmarks/results/startup/CPU.json

Each round runs every method once, in the same order (so load drifts hit them alike), as its own
process: `mars generate "Hi" --max-new-tokens 8 --json` cold (MARS_SERVER=off: torch's import and
the model's load in the process), warm (MARS_SERVER=on: a warm server started before the rounds
decodes it), both on the transformers engine, with the default drafter and with `--draft none`,
and on `--engine llama.cpp` where .venv-llamacpp is set up; `mars generate --help`; and
llama-cpp-python's import, `Llama(path)` and an 8-token chat completion (the reference the issue
names). Edit no file of the package while it runs: a warm server of other code is not used (it
makes way, and the "warm" rows would time cold starts). Printed: wall seconds (min / median) per method, and each mars method's own phases
(import, load, tuning, prefill, decoding from `--json`'s `stats.startup_s`), min / median.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mars_cli.tuning.machine import cpu_name  # noqa: E402

PROMPT = "Hi"
TOKENS = "8"
LLAMA_VENV = REPO / ".venv-llamacpp" / "bin" / "python"
LLAMA_ONE_LINER = """
import sys
from llama_cpp import Llama
model = Llama(sys.argv[1], n_threads=2, verbose=False)
reply = model.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0)
print(reply["choices"][0]["message"]["content"])
"""


def methods(python: str, gguf: str, llama: bool) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (command, environment changes)."""
    mars = [python, "-m", "mars_cli.cli", "generate", PROMPT, "--max-new-tokens", TOKENS, "--json"]
    found = {
        "transformers cold": (mars, {"MARS_SERVER": "off"}),
        "transformers warm": (mars, {"MARS_SERVER": "on"}),
        "transformers plain cold": (mars + ["--draft", "none"], {"MARS_SERVER": "off"}),
        "transformers plain warm": (mars + ["--draft", "none"], {"MARS_SERVER": "on"}),
        "generate --help": ([python, "-m", "mars_cli.cli", "generate", "--help"], {}),
    }
    if llama:
        on_llama = [str(LLAMA_VENV), "-m", "mars_cli.cli", "generate", PROMPT, "--max-new-tokens", TOKENS, "--json",
                    "--engine", "llama.cpp"]
        found["llama.cpp cold"] = (on_llama, {"MARS_SERVER": "off"})
        found["llama.cpp warm"] = (on_llama, {"MARS_SERVER": "on"})
        found["llama-cpp-python one-liner"] = ([str(LLAMA_VENV), "-c", LLAMA_ONE_LINER, gguf], {})
    return found


def run_once(command: list[str], changes: dict[str, str], timeout: float) -> dict:
    env = {**os.environ, **changes}
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    wall = time.perf_counter() - began
    row: dict = {"wall_s": wall, "rc": done.returncode}
    if done.returncode != 0:
        row["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
        return row
    if "--json" in command:
        payload = json.loads(done.stdout.strip().splitlines()[-1])
        row["phases"] = payload["stats"]["startup_s"]
        row["server"] = payload.get("server")
    return row


def warm_up(methods_run: dict, timeout: float) -> None:
    """One run of each mars method first: the cache converted, the tuning entries read, and a warm
    server per engine started (MARS_SERVER=auto) with its session loaded."""
    for name, (command, changes) in methods_run.items():
        if "--json" in command and name.endswith("cold"):
            run_once(command, {**changes, "MARS_SERVER": "auto"}, timeout)
    time.sleep(5)
    for name, (command, changes) in methods_run.items():
        if name.endswith("warm"):
            run_once(command, changes, timeout)  # waits for the server's preload, then warms its session


def summarise(rows: list[dict]) -> dict:
    walls = [row["wall_s"] for row in rows if row.get("rc") == 0]
    result: dict = {"runs": len(rows), "failed": sum(row.get("rc") != 0 for row in rows)}
    if walls:
        result.update(wall_min=min(walls), wall_median=statistics.median(walls))
    phases = [row["phases"] for row in rows if row.get("phases")]
    if phases:
        result["phases"] = {name: {"min": min(values), "median": statistics.median(values)}
                            for name in phases[0]
                            if (values := [p[name] for p in phases if p.get(name) is not None])}
    if any("server" in row for row in rows):  # how many the warm server answered (a stale one makes way)
        result["served_by_warm_server"] = sum(bool(row.get("server")) for row in rows)
    errors = [row["error"] for row in rows if "error" in row]
    if errors:
        result["errors"] = errors[:3]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from mars_cli.models.embedded import EMBEDDED

    gguf = str(EMBEDDED["smollm2-135m"].locate_gguf())
    llama = (REPO / ".venv-llamacpp" / ".installed").is_file()  # `make setup-llamacpp` finished
    chosen = methods(sys.executable, gguf, llama)
    warm_up(chosen, args.timeout)
    rows: dict[str, list[dict]] = {name: [] for name in chosen}
    for round_ in range(args.repeats):
        for name, (command, changes) in chosen.items():
            rows[name].append(run_once(command, changes, args.timeout))
        print(f"round {round_ + 1}/{args.repeats} done", file=sys.stderr)
    results = {name: summarise(found) for name, found in rows.items()}
    reference = results.get("llama-cpp-python one-liner", {}).get("wall_median")
    print(f"{cpu_name()} ({platform.machine()}), {os.cpu_count()} cores; median of {args.repeats}, interleaved")
    print(f"{'method':32} {'wall min':>9} {'median':>9} {'x llama-cpp-python':>19}  phases (median s)")
    for name, result in results.items():
        median = result.get("wall_median")
        ratio = f"{median / reference:.2f}" if reference and median else "-"
        phases = ", ".join(f"{k} {v['median']:.2f}" for k, v in result.get("phases", {}).items())
        wall = f"{result.get('wall_min', float('nan')):9.2f} {median if median else float('nan'):9.2f}"
        served = f"  [warm server: {result['served_by_warm_server']}/{result['runs']}]" if name.endswith("warm") else ""
        failed = f"  FAILED: {result['errors']}" if "errors" in result else ""
        print(f"{name:32} {wall} {ratio:>19}  {phases}{served}{failed}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"cpu": cpu_name(), "cores": os.cpu_count(), "repeats": args.repeats,
                                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                                                 capture_output=True, text=True).stdout.strip(),
                                        "results": results, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
