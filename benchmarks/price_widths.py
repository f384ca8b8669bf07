"""The modelled speedup of a finished `mars eval` run's methods on another engine's cost curve:
each sample's target forwards by width (results.json's per-sample figures) priced by a cached
curve, for instance llama.cpp's, to ask what a drafter measured on one engine would buy on
another before building it there (docs/llamacpp.md, "A draft head on llama.cpp").

    python benchmarks/price_widths.py RUN_DIR [RUN_DIR ...] --engine llama.cpp --threads 2

The curve is the newest cached one (`mars profile --widths --engine llama.cpp` or `mars tune
--engine llama.cpp` measures it) whose key matches --engine, --threads and the target's
fingerprint. Drafting is not priced: the figure is an upper bound on what the method buys there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mars_cli.evaluation.figures import METRICS, curve_from, within  # noqa: E402
from mars_cli.paths import cache_dir  # noqa: E402


def cached_curve(fingerprint: str, engine: str, threads: int) -> dict:
    """The widest cached curve for this target on `engine` with `threads` threads."""
    found = []
    for path in (cache_dir() / "costs").glob("*.json"):
        entry = json.loads(path.read_text())
        key = entry.get("key", {})
        if key.get("model") == fingerprint and key.get("engine") == engine and key.get("threads") == threads:
            found.append(entry)
    if not found:
        sys.exit(f"no cached {engine} curve for {fingerprint[:12]} with {threads} threads: run "
                 f"`mars profile --widths --engine {engine}` first")
    return max(found, key=lambda entry: len(entry["ms_by_width"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="mars eval --out directories (or results.json files)")
    parser.add_argument("--engine", default="llama.cpp")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for run in args.runs:
        results = json.loads((run / "results.json" if run.is_dir() else run).read_text())
        entry = cached_curve(results["identity"]["target"], args.engine, args.threads)
        curve = curve_from(entry["ms_by_width"])
        samples = results["samples"]
        vanilla = {(f["suite"], f["sample_id"]): f for f in samples if f["method"] == "vanilla"}
        for method in dict.fromkeys(f["method"] for f in samples):
            mine = [f for f in samples if f["method"] == method]
            priced = within(METRICS["modelled"], mine, vanilla, curve)
            own = within(METRICS["modelled"], mine, vanilla, curve_from(results["cost_curve"]["ms_by_width"]))
            tau = within(METRICS["tau"], mine, vanilla, None)
            rows.append({"run": str(run), "method": method, "num_draft": results["config"]["num_draft"],
                         "tau": tau.estimate, "modelled_here": own.estimate, "modelled_there": priced.estimate,
                         "there_interval": [priced.low, priced.high]})
            print(f"{run.name:24} {method:22} k={results['config']['num_draft']!s:>4} tau {tau.estimate:.2f}  "
                  f"modelled: own curve {own.estimate:.3f}x, {args.engine} {priced.estimate:.3f}x "
                  f"[{priced.low:.3f}, {priced.high:.3f}]")
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "curve": entry, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
