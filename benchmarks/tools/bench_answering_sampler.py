"""A sampled answering step of SmolLM2-135M at batch 64: transformers' own top-p sampling against
`head.data.NucleusDraw` under greedy search (what train-head's data step and the GPU tool use).

The same 64 training prompts (sampled ones of head_prompts_large.jsonl), packed float32 linears,
the same number of new tokens forced in both (`min_new_tokens`), the two interleaved three times;
a step's time is (a run of 1 + N tokens - a run of 1 token) / N, so the prefill cancels out.

    python benchmarks/tools/bench_answering_sampler.py --new-tokens 48 --out benchmarks/results/answering-sampler/cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from transformers import LogitsProcessorList

from mars_cli.decoding import packing
from mars_cli.head.data import NucleusDraw, _padded
from mars_cli.models import load_model
from mars_cli.prompts import encode_prompt, load_prompts

PROMPTS = Path(__file__).resolve().parents[2] / "mars_cli" / "data" / "head_prompts_large.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    target = load_model("smollm2-135m", device="cpu", dtype="float32")
    packing.install(target.model, rows=args.batch)
    prompts, _, _ = load_prompts(PROMPTS, PROMPTS, 10)
    encoded = [encode_prompt(target.tokenizer, p) for p in prompts[1 : 1 + 2 * args.batch : 2]]
    ids, mask = _padded(encoded, 2, target.device, left=True)

    def run(kind: str, new: int) -> float:
        options = ({"do_sample": True, "temperature": 0.8, "top_p": 0.95, "top_k": 0} if kind == "transformers"
                   else {"do_sample": False, "logits_processor": LogitsProcessorList([NucleusDraw(0.8, 0.95, 1)])})
        start = time.perf_counter()
        with torch.inference_mode():
            target.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                  pad_token_id=2, **options)
        return time.perf_counter() - start

    steps: dict[str, list[float]] = {"transformers": [], "nucleus": []}
    for repeat in range(3):
        for kind in steps:
            short, long = run(kind, 1), run(kind, 1 + args.new_tokens)
            steps[kind].append((long - short) / args.new_tokens)
            print(f"{kind} {repeat}: {steps[kind][-1] * 1000:.0f} ms a step", flush=True)
    median = {kind: sorted(values)[1] for kind, values in steps.items()}
    result = {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__, "batch": args.batch,
              "new_tokens": args.new_tokens, "ms_per_step": {k: [round(v * 1000, 1) for v in vs] for k, vs in steps.items()},
              "median_ms": {k: round(v * 1000, 1) for k, v in median.items()},
              "speedup": round(median["transformers"] / median["nucleus"], 3)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
