"""The GPU path: the default `mars generate` against plain compiled decoding and MARS, interleaved.

Issue 58, item 4: the default (`--compile auto`: a captured target, captured head drafting,
trees) against plain compiled decoding, MARS at 0.9 and 0.97 beside them, and the drafting share
of a round, on held-out chat, code and multiturn prompts, interleaved.

    python benchmarks/bench_gpu_default.py --out gpu-default.json              # on the GPU machine
    python benchmarks/bench_gpu_default.py --device cpu --compile off --prompts 3 --new-tokens 16 \\
        --out /tmp/gpu-default-cpu.json                                        # the same code, tested on a CPU

Every stage is bounded: `--budget-s` stops starting new prompts once passed, and the JSON is
written after every prompt round, so a run cut short by its machine still reports.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interleaved import decode_rate, held_out_prompts, summary  # noqa: E402

from mars_cli.options import DecodingOptions  # noqa: E402
from mars_cli.session import Session  # noqa: E402

METHODS = {  # name -> options; --compile comes from the command line (auto on the GPU)
    "plain": {"draft": "none"},
    "default": {"draft": "auto", "num_draft": "auto"},
    "mars 0.9": {"draft": "auto", "num_draft": "auto", "verify": "mars", "threshold": 0.9},
    "mars 0.97": {"draft": "auto", "num_draft": "auto", "verify": "mars", "threshold": 0.97},
}


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    from mars_cli.tuning.machine import cpu_name

    return cpu_name()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compile", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.monotonic()
    common = {"target": args.target, "device": args.device, "compile": args.compile, "dtype": args.dtype,
              "max_new_tokens": args.new_tokens}
    sessions = {name: Session(DecodingOptions.of(**{**common, **options})) for name, options in METHODS.items()}
    prompts = held_out_prompts(args.prompts)
    record: dict = {"device": device_name(args.device), "machine": platform.machine(), "target": args.target,
                    "options": common, "new_tokens": args.new_tokens, "date": time.strftime("%Y-%m-%d"),
                    "config": {name: {k: v for k, v in s.config().items()
                                      if k in ("drafter", "tree_topk", "tree_tokens", "dtype", "compiled", "verify",
                                               "threshold", "int8_head")} for name, s in sessions.items()}}
    for session in sessions.values():  # warm-up: compiles, captures, cost curves
        decode_rate(session, prompts[0], args.new_tokens)
    record["warm_up_s"] = time.monotonic() - started
    names = list(METHODS)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for index, prompt in enumerate(prompts):
        if time.monotonic() - started > args.budget_s:
            record["cut_short"] = f"budget of {args.budget_s:.0f} s spent after {index} prompts"
            break
        for name in names[index % len(names):] + names[: index % len(names)]:
            runs[name].append(decode_rate(sessions[name], prompt, args.new_tokens))
        plain = summary(runs["plain"])["tokens_per_s"]
        record["table"] = {name: {**summary(rows), "x_plain": summary(rows)["tokens_per_s"] / plain,
                                  "prompts": len(rows)} for name, rows in runs.items()}
        record["strict_same_tokens_as_plain"] = all(a["tokens"] == b["tokens"]
                                                    for a, b in zip(runs["default"], runs["plain"]))
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    for name, row in record.get("table", {}).items():
        print(f"{name:10s} {row['tokens_per_s']:8.1f} tok/s  x plain {row['x_plain']:.2f}  tau {row['tau']:.2f}  "
              f"drafting {100 * row['draft_share']:.0f}% of a round")


if __name__ == "__main__":
    main()
