"""How well `mars eval --baseline --max-regression` gates catch a planted regression and how often
they raise a false alarm, on the embedded model (docs/ci.md, "How sure the gates are").

Planted regressions are draft heads with Gaussian noise added to every weight (scaled by each
tensor's own standard deviation), which lowers tau by a few percent. One `mars eval` run decodes
the pool of samples with vanilla, the shipped head and each noisy head (greedy, float32, a fixed
draft shape: the CI example's flags); a second run of the shipped head against the first as its
baseline checks the deterministic figures repeat exactly; two sampled runs (T = 0.7, seeds 1 and
2) of the same code give the statistical gates' false alarms. Detection and false-alarm rates
come from random subsets of the pool (n samples a suite), each judged by the gates exactly as the
CLI judges a run (baseline.regression_gates).

    python benchmarks/bench_ci_gates.py --out benchmarks/results/ci_gates.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mars_cli.evaluation.baseline import regression_gates  # noqa: E402
from mars_cli.paths import cache_dir  # noqa: E402

HEAD = REPO / "mars_cli" / "heads" / "smollm2-135m"
# docs/ci.md's flags: every choice that would otherwise follow this machine's timings fixed
FIXED = ["--dtype", "float32", "--packed-weights", "off", "--int8-head", "off", "--num-draft", "4", "--draft-topk", "1"]


def noisy_head(scale: float, folder: Path, seed: int = 0) -> Path:
    """A copy of the shipped head with N(0, (scale * std)^2) added to each weight tensor."""
    import torch
    from safetensors.torch import load_file, save_file

    out = folder / f"noise-{scale:g}"
    if (out / "model.safetensors").exists():
        return out
    shutil.copytree(HEAD, out, dirs_exist_ok=True)
    weights = load_file(HEAD / "model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in weights.items():
        if tensor.is_floating_point() and tensor.numel() > 1:
            noise = torch.randn(tensor.shape, generator=generator) * tensor.float().std() * scale
            weights[name] = (tensor.float() + noise).to(tensor.dtype)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def mars_eval(arguments: list[str], out: Path, reuse: bool = False) -> dict:
    """One `mars eval` run in its own process; its results document (`reuse`: a finished run of
    an earlier invocation is read instead of run again)."""
    if reuse and (out / "results.json").exists():
        document = json.loads((out / "results.json").read_text())
        if document.get("complete"):
            return {**document, "elapsed_s": None}
    shutil.rmtree(out, ignore_errors=True)
    command = [str(Path(sys.executable).with_name("mars")), "eval", *arguments, "--out", str(out)]
    started = time.perf_counter()
    finished = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if finished.returncode not in (0, 1):
        sys.exit(f"mars eval failed ({finished.returncode}): {finished.stderr[-2000:]}")
    document = json.loads((out / "results.json").read_text())
    document["elapsed_s"] = time.perf_counter() - started
    return document


def renamed(records: list[dict], method: str, to: str) -> list[dict]:
    return [{**r, "method": to} for r in records if r["method"] == method]


def rate(current: list[dict], baseline: list[dict], curve: dict | None, per_suite: int, limits: dict,
         trials: int, seed: int, deterministic: bool) -> float:
    """The share of random subsets (per_suite samples of each suite) where a gate fails."""
    rng = np.random.default_rng(seed)
    suites = sorted({r["suite"] for r in baseline})
    ids = {s: sorted({r["sample_id"] for r in baseline if r["suite"] == s}) for s in suites}
    failures = 0
    for _ in range(trials):
        chosen = {(s, i) for s in suites for i in rng.choice(ids[s], size=min(per_suite, len(ids[s])), replace=False)}
        ours = [r for r in current if (r["suite"], r["sample_id"]) in chosen]
        theirs = [r for r in baseline if (r["suite"], r["sample_id"]) in chosen]
        outcomes = regression_gates(ours, {"samples": theirs, "cost_curve": curve}, [*suites, "all"], limits,
                                    deterministic)
        failures += any(not o["passed"] for o in outcomes)
    return failures / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="chat,code")
    parser.add_argument("--limit", type=int, default=16, help="samples a suite in the pool")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--scales", default="0.04,0.06,0.08,0.1,0.14", help="noise scales of the planted heads")
    parser.add_argument("--sizes", default="4,8,12", help="samples a suite, for the rates")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--sampled-limit", type=int, default=8, help="samples a suite in the two sampled runs")
    parser.add_argument("--reuse", action="store_true", help="read runs an earlier invocation finished")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    work = cache_dir() / "bench" / "ci_gates"
    work.mkdir(parents=True, exist_ok=True)
    scales = [float(s) for s in args.scales.split(",")]
    heads = {scale: noisy_head(scale, work) for scale in scales}
    pool = ["--suite", args.suite, "--limit", str(args.limit), "-n", str(args.tokens), *FIXED]
    methods = ",".join(["vanilla", "strict:head", *(f"strict:head:{path}" for path in heads.values())])
    first = mars_eval([*pool, "--methods", methods], work / "run-1", args.reuse)
    again = mars_eval([*pool, "--methods", "vanilla,strict:head", "--baseline", str(work / "run-1"),
                       "--baseline-ignore", "head", "--max-regression", "tau=0,modelled=0,agreement=0,logprob=0"],
                      work / "run-2", args.reuse)
    small = ["--suite", args.suite, "--limit", str(args.sampled_limit), "-n", str(args.tokens), *FIXED]
    sampled = [mars_eval([*small, "--methods", "vanilla,strict:head", "--temperature", "0.7", "--seed", str(seed)],
                         work / f"sampled-{seed}", args.reuse) for seed in (1, 2)]

    records, curve = list(first["samples"]), first["cost_curve"]
    table = {row["method"]: row for row in first["table"]["all"]}
    for scale, path in heads.items():  # a scale the first run did not decode (added later): a run of its own
        name = f"strict:head:{path}"
        if name not in table:
            extra = mars_eval([*pool, "--methods", f"vanilla,{name}"], work / f"run-noise-{scale:g}", args.reuse)
            records += [r for r in extra["samples"] if r["method"] == name]
            table[name] = next(row for row in extra["table"]["all"] if row["method"] == name)
    base = renamed(records, "strict:head", "strict:head")
    planted = {}
    for scale, path in heads.items():
        name = f"strict:head:{path}"
        drop = table[name]["tau"] / table["strict:head"]["tau"] - 1
        current = renamed(records, name, "strict:head")
        planted[f"{scale:g}"] = {
            "tau": table[name]["tau"], "tau_change": drop,
            "detected": {f"{limit:g}": {str(n): rate(current, base, curve, n, {"tau": limit}, args.trials, 1, True)
                                        for n in map(int, args.sizes.split(","))}
                         for limit in (0.0, 0.02)}}
    unchanged = [c for c in again["baseline"]["comparisons"] if c["deterministic"]]
    sampled_base = renamed(sampled[0]["samples"], "strict:head", "strict:head")
    sampled_now = renamed(sampled[1]["samples"], "strict:head", "strict:head")
    sampled_sizes = [n for n in map(int, args.sizes.split(",")) if n <= args.sampled_limit]
    false_alarms = {
        "deterministic_rerun": {"comparisons": len(unchanged),
                                "nonzero": sum(c["change"] != 0 or c["low"] != 0 or c["high"] != 0 for c in unchanged),
                                "gates_failed": again["gates"]["failures"]},
        "sampled_tau": {str(n): rate(sampled_now, sampled_base, curve, n, {"tau": 0.0}, args.trials, 2, False)
                        for n in sampled_sizes},
        "sampled_tau_agreement_logprob": {
            str(n): rate(sampled_now, sampled_base, curve, n, {"tau": 0.0, "agreement": 0.0, "logprob": 0.0},
                         args.trials, 3, False) for n in sampled_sizes},
        "wall_speedup": {str(n): rate(renamed(again["samples"], "strict:head", "strict:head"), base, curve, n,
                                      {"speedup": 0.0}, args.trials, 4, True) for n in map(int, args.sizes.split(","))},
    }
    result = {"command": " ".join(sys.argv), "cpu": _cpu(), "pool": pool, "trials": args.trials,
              "shipped_tau": table["strict:head"]["tau"], "planted": planted, "false_alarms": false_alarms,
              "run_seconds": {"first": first["elapsed_s"], "again": again["elapsed_s"],
                              "sampled": [s["elapsed_s"] for s in sampled]}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            return next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        return os.uname().machine


if __name__ == "__main__":
    main()
