"""What bfloat16 costs in quality, and what stays exact, against float32 on the built-in suites.

The built-in suites decoded greedily by the target in float32 and in bfloat16, plain and speculative.

For every sample (first turn, chat template) it records, per method:
- agreement with the float32 plain greedy output (identical, token agreement, common prefix);
- the mean log-probability of the output under the float32 target (teacher-forced, so every
  method is scored by the same reference model);
- the suite's task metric where it has one (code tests run sandboxed with --allow-code-execution);
- for speculative methods, whether the output equals plain greedy decoding in the same dtype
  (strict verification is exact with respect to the verification pass's logits; in reduced
  precision a (k + 1)-wide forward is not bit-identical to k + 1 one-wide ones).

Timings are not the point here (see bench_decoding.py); nothing is interleaved for speed.

    python benchmarks/bench_dtype_quality.py --limit 6 --out benchmarks/results/dtype-quality.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

from mars_cli.evaluation.metrics import common_prefix, token_agreement
from mars_cli.evaluation.runner import encode_turn, task_score
from mars_cli.evaluation.suites import BUILTIN, load_suite
from mars_cli.models import load_model
from mars_cli.options import DecodingOptions
from mars_cli.session import Session

# name -> (dtype, flat options)
METHODS = {
    "plain float32": ("float32", {"draft": "none"}),
    "plain bfloat16": ("bfloat16", {"draft": "none"}),
    "ngram strict bfloat16": ("bfloat16", {"draft": "ngram", "verify": "strict", "num_draft": 4}),
    "head strict bfloat16": ("bfloat16", {"draft": "head", "verify": "strict", "num_draft": 4}),
    "ngram strict float32": ("float32", {"draft": "ngram", "verify": "strict", "num_draft": 4}),
    "head strict float32": ("float32", {"draft": "head", "verify": "strict", "num_draft": 4}),
}


@torch.inference_mode()
def mean_logprob(model, prompt_ids: list[int], output_ids: list[int]) -> float:
    """Mean log-probability of `output_ids` after `prompt_ids` under `model` (teacher-forced)."""
    if not output_ids:
        return 0.0
    ids = torch.tensor([prompt_ids + output_ids])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    picked = torch.log_softmax(logits, dim=-1)[torch.arange(len(output_ids)), torch.tensor(output_ids)]
    return float(picked.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--suites", default=",".join(BUILTIN))
    parser.add_argument("--limit", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--allow-code-execution", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/dtype-quality.json"))
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    targets = {dtype: load_model(args.target, device="cpu", dtype=dtype) for dtype in ("float32", "bfloat16")}
    sessions = {name: Session(DecodingOptions.of(target=args.target, dtype=dtype, max_new_tokens=args.max_new_tokens,
                                                 **options), target=targets[dtype])
                for name, (dtype, options) in METHODS.items()}
    reference_model = targets["float32"].model
    records = []
    for suite_name in args.suites.split(","):
        suite = load_suite(suite_name, args.limit)
        for sample in suite.samples:
            first_turn = [{"role": "user", "content": sample.turns[0]}]
            outputs = {}
            for name, session in sessions.items():
                prompt_ids = encode_turn(session, sample, first_turn)
                result = session.run(prompt_ids)
                outputs[name] = (prompt_ids, result)
            reference = outputs["plain float32"][1].token_ids
            for name, (prompt_ids, result) in outputs.items():
                dtype = METHODS[name][0]
                same_dtype_plain = outputs[f"plain {dtype}"][1].token_ids
                records.append({
                    "suite": suite.name, "sample": sample.id, "method": name, "dtype": dtype,
                    "new_tokens": len(result.token_ids),
                    "identical_to_float32_greedy": result.token_ids == reference,
                    "token_agreement_float32": token_agreement(result.token_ids, reference),
                    "common_prefix_float32": common_prefix(result.token_ids, reference),
                    "identical_to_plain_same_dtype": result.token_ids == same_dtype_plain,
                    "logprob_under_float32": mean_logprob(reference_model, prompt_ids, result.token_ids),
                    "task_score": task_score(suite, sample, result.text, args.allow_code_execution),
                    "tau": result.stats.summary()["mean_accepted"],
                })
            print(f"{suite.name} {sample.id} done", file=sys.stderr, flush=True)

    summary = {}
    for name in METHODS:
        mine = [r for r in records if r["method"] == name]
        scores = [r["task_score"] for r in mine if r["task_score"] is not None]
        summary[name] = {
            "samples": len(mine),
            "identical_to_float32_greedy": sum(r["identical_to_float32_greedy"] for r in mine),
            "token_agreement_float32": statistics.mean(r["token_agreement_float32"] for r in mine),
            "identical_to_plain_same_dtype": sum(r["identical_to_plain_same_dtype"] for r in mine),
            "mean_logprob_under_float32": statistics.mean(r["logprob_under_float32"] for r in mine),
            "task_metric": statistics.mean(scores) if scores else None,
            "scored_samples": len(scores),
            "tau": statistics.mean(r["tau"] for r in mine),
        }
    result = {
        "command": " ".join(["python"] + sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "target": args.target,
        "max_new_tokens": args.max_new_tokens,
        "summary": summary,
        "records": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("| method | samples | = float32 greedy | token agr. vs float32 | = plain, same dtype | logprob (float32 scorer) | task metric | tau |")
    print("|---|---|---|---|---|---|---|---|")
    for name, row in summary.items():
        metric = "-" if row["task_metric"] is None else f"{row['task_metric']:.3f} ({row['scored_samples']})"
        print(f"| {name} | {row['samples']} | {row['identical_to_float32_greedy']} | {row['token_agreement_float32']:.3f} | "
              f"{row['identical_to_plain_same_dtype']} | {row['mean_logprob_under_float32']:.3f} | {metric} | {row['tau']:.2f} |")


if __name__ == "__main__":
    main()
