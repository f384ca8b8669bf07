"""MARS inside vLLM against vLLM's strict rule and plain decoding, and against our own loop.

At several batch sizes, and against our own loop at batch 1 (issue 25's benchmark).

Run with the vLLM environment's Python (make setup-vllm):

    LD_PRELOAD=$PWD/.venv-vllm/lib/libiomp5.so VLLM_CPU_KVCACHE_SPACE=2 \\
        .venv-vllm/bin/python benchmarks/bench_vllm.py --out benchmarks/results/vllm.json

vLLM part: one engine per drafter (vanilla's has none, the EAGLE-3 head's), started once and kept
for every batch size; methods rotate per batch (`mars eval --engine vllm`'s runner). Methods:
vanilla, strict, mars (the shipped profile's theta), mars@0.9, all chains of --num-draft. Our
part: `mars eval` in the main environment (.venv, its own transformers) with the same suites,
methods and chain length, run after the vLLM part (never both at once on a 2-core machine). The
tau ratio MARS/strict is compared between the two engines. Tokens/s ratios hold within one run
of one engine; across engines they are two runs on the same machine, one after the other.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mars_cli.evaluation.aggregate import aggregate  # noqa: E402
from mars_cli.evaluation.methods import parse_methods  # noqa: E402
from mars_cli.evaluation.runner import SampleLog  # noqa: E402
from mars_cli.evaluation.suites import load_suites  # noqa: E402
from mars_cli.options import DecodingOptions  # noqa: E402
from mars_cli.serving import evaluation  # noqa: E402
from mars_cli.serving.engine import require_vllm  # noqa: E402

METHODS = "vanilla,strict,mars"
SWEEP = [0.9]


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def vllm_part(args, options: DecodingOptions) -> dict:
    _, suites = load_suites(args.suites, args.limit, False)
    methods = parse_methods(METHODS, SWEEP)
    started = time.perf_counter()
    engines = evaluation.start_engines(methods, options, enforce_eager=args.eager)
    startup = time.perf_counter() - started
    tables = {}
    try:
        for batch_size in args.batch_sizes:
            log = SampleLog(None)
            evaluation.evaluate(suites, methods, options, engines, log, batch_size, False, lambda name: None)
            tables[str(batch_size)] = aggregate(log.records, methods, [s.name for s in suites])
            print(f"vllm batch {batch_size}: " + ", ".join(
                f"{row['method']} {row['tokens_per_s']:.1f} tok/s tau {row['tau']:.2f}"
                for row in tables[str(batch_size)]["all"]), flush=True)
        config, details = evaluation.describe(engines, methods, options, 0)
    finally:
        engines.shutdown()
    return {"startup_s": startup, "config": config, "methods": details, "tables": tables}


def ours_part(args) -> dict:
    """Our own loop at batch 1, in the main environment: `mars eval --json`."""
    command = [str(ROOT / ".venv/bin/mars"), "eval", "--suite", args.suites, "--limit", str(args.limit),
               "--methods", METHODS, "--sweep", "0.9:0.9:0.1", "--draft", "head", "--draft-topk", "1",
               "--num-draft", str(args.num_draft), "--max-new-tokens", str(args.max_new_tokens),
               "--dtype", args.dtype, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    results = json.loads(done.stdout)
    return {"command": " ".join(command[1:]), "table": results["table"], "methods": results["methods"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suites", default="chat,code")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--batch-sizes", type=lambda t: [int(x) for x in t.split(",")], default=[1, 4, 16])
    parser.add_argument("--num-draft", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--eager", action="store_true", help="vLLM without torch.compile (faster start)")
    parser.add_argument("--skip-ours", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    require_vllm()
    import torch
    import vllm

    options = DecodingOptions.of(target="smollm2-135m", draft="head", num_draft=args.num_draft,
                                 max_new_tokens=args.max_new_tokens, dtype=args.dtype, seed=0)
    report = {"command": " ".join(sys.argv), "cpu": cpu_name(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "vllm": vllm.__version__, "suites": args.suites, "limit": args.limit,
              "vllm_part": vllm_part(args, options)}
    if not args.skip_ours:
        report["ours"] = ours_part(args)
        ours = {row["method"]: row for row in report["ours"]["table"]["all"]}
        inside = {row["method"]: row for row in report["vllm_part"]["tables"]["1"]["all"]}
        report["tau_ratio"] = {name: {"vllm": inside[name]["tau"] / inside["strict"]["tau"],
                                      "ours": ours[name]["tau"] / ours["strict"]["tau"]}
                               for name in ("mars", "mars@0.9")}
        print("tau ratio over strict:", json.dumps(report["tau_ratio"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
