"""What one drafting step of an EAGLE-3 head costs, by draft vocabulary size and dtype (issue 27).

    python benchmarks/bench_head_cost.py --vocab 4096,8192,16384 --dtypes float32,bfloat16

Heads of the shipped head's shape for the embedded target (one layer as wide as SmolLM2-135M's,
its LM-head rows as the draft vocabulary), after 200 true pairs in the head's cache: a chain step
(one pair, then its scores) and a tree level (a frontier of 4 pairs, then their scores), median
milliseconds of `--repeats` timed calls, every variant interleaved in each repeat. Timings only:
acceptance by vocabulary size comes from `benchmarks/head_scaling.py`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from mars_cli.tuning.machine import machine_facts
from mars_cli.head.model import HeadCache
from mars_cli.head.train import new_eagle3_head
from mars_cli.models import load_model

CONTEXT = 200  # true pairs in the head's cache when it drafts
FRONTIER = 4  # a tree level of the default 4 x 16 tree


def step_ms(head, cache_pairs: int, width: int, dtype: torch.dtype) -> float:
    """One drafting step over `width` pairs after `cache_pairs` cached ones, with its scores."""
    cache = HeadCache()
    features = torch.randn(cache_pairs, head.feature_width, dtype=dtype)
    tokens = torch.randint(0, 1000, (cache_pairs,))
    with torch.inference_mode():
        head.step(features, tokens, cache)
        fed = torch.randn(width, head.config.hidden_size, dtype=dtype)
        new_tokens = torch.randint(0, 1000, (width,))
        positions = torch.full((width,), cache_pairs, dtype=torch.long)
        visible = torch.ones(width, cache_pairs + width, dtype=torch.bool)
        started = time.perf_counter()
        state = head.step(fed, new_tokens, cache, positions, visible)
        torch.log_softmax(head.logits(state).float(), dim=-1)
        return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", default="4096,8192,16384")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    target = load_model("smollm2-135m", device="cpu", dtype="float32")
    heads = {}
    for size in (int(v) for v in args.vocab.split(",")):
        for name in args.dtypes.split(","):
            dtype = getattr(torch, name)
            head = new_eagle3_head(target, torch.arange(size), {}).eval().to(dtype)
            heads[(size, name)] = (head, dtype)
    times: dict[tuple, list[float]] = {(key, width): [] for key in heads for width in (1, FRONTIER)}
    for key, (head, dtype) in heads.items():  # warm-up
        step_ms(head, CONTEXT, 1, dtype)
        step_ms(head, CONTEXT, FRONTIER, dtype)
    for _ in range(args.repeats):
        for key, (head, dtype) in heads.items():
            for width in (1, FRONTIER):
                times[(key, width)].append(step_ms(head, CONTEXT, width, dtype))
    rows = []
    for key in heads:
        chain, level = (statistics.median(times[(key, w)]) for w in (1, FRONTIER))
        rows.append({"vocab": key[0], "dtype": key[1], "chain_step_ms": round(chain, 3),
                     "tree_level_ms": round(level, 3)})
    machine = machine_facts()
    print(json.dumps(machine))
    print("| draft vocabulary | dtype | chain step (ms) | tree level of 4 (ms) |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['vocab']:,} | {row['dtype']} | {row['chain_step_ms']:.2f} | {row['tree_level_ms']:.2f} |")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
