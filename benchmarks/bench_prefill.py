"""A long prompt's prefill in each dtype, on the embedded model: the seconds `TargetScorer.start`
takes for a prompt of N tokens (a public-domain text repeated), dtypes interleaved, the median
counting, and each process's peak resident memory growth. The quantized modes feed a prompt of
lean.PROMPT_ROWS rows or more on dense kernels (decoding/lean.py, `LeanForward.prompt`).

    python benchmarks/bench_prefill.py [--lengths 2000,6000] [--dtypes float32,q4a8] [--repeats 3] [--out F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mars_cli.decoding.target import TargetScorer  # noqa: E402
from mars_cli.options import ModelOptions  # noqa: E402
from mars_cli.tuning.machine import cpu_name  # noqa: E402

TEXT = Path(__file__).resolve().parents[1] / "mars_cli" / "data" / "calibration_prompts.jsonl"


def prompt_ids(tokenizer, length: int) -> torch.Tensor:
    """`length` token ids of the calibration prompts' text, repeated as needed."""
    text = " ".join(json.loads(line)["prompt"] for line in TEXT.read_text(encoding="utf-8").splitlines() if line.strip())
    ids = tokenizer(text)["input_ids"]
    return torch.tensor((ids * (length // len(ids) + 1))[:length], dtype=torch.long)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--lengths", default="2000,6000")
    parser.add_argument("--dtypes", default="float32,q4a8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    scorers = {}
    for dtype in args.dtypes.split(","):
        target = ModelOptions(target=args.target, device="cpu", dtype=dtype, packed_weights="off").load()
        scorers[dtype] = TargetScorer(target)
    seconds: dict[str, list[float]] = {f"{d}@{n}": [] for d in scorers for n in lengths}
    for _ in range(args.repeats):
        for n in lengths:
            for dtype, scorer in scorers.items():
                ids = prompt_ids(scorer.target.tokenizer, n)
                start = time.perf_counter()
                scorer.start(ids)
                seconds[f"{dtype}@{n}"].append(time.perf_counter() - start)
    rows = []
    for n in lengths:
        base = statistics.median(seconds[f"{args.dtypes.split(',')[0]}@{n}"])
        for dtype in scorers:
            median = statistics.median(seconds[f"{dtype}@{n}"])
            rows.append({"tokens": n, "dtype": dtype, "seconds": median, "relative": median / base,
                         "samples": seconds[f"{dtype}@{n}"]})
            print(f"{n:6d} tokens  {dtype:8s} {median:7.2f} s  ({median / base:.2f}x the first dtype)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"cpu": cpu_name(), "threads": torch.get_num_threads(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
