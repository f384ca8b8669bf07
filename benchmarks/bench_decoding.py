"""Decoding benchmark on the embedded model: our loop against transformers, strict against MARS.

One process, one loaded target, the same prompts in the same order; methods interleaved per
prompt after a warm-up, so machine drift hits all alike. Speedups are ratios to our plain loop
(and to transformers' plain generate) measured in this run. Quality sits beside speed: the
target's mean log-probability of what was generated, and agreement with the strict greedy
output (token level, common prefix and ROUGE-L).

    python benchmarks/bench_decoding.py --out benchmarks/results/decoding.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from mars_cli.evaluation.metrics import common_prefix, rouge_l, token_agreement
from mars_cli.evaluation.runner import rss_mb
from mars_cli.models import load_model
from mars_cli.options import DecodingOptions
from mars_cli.session import Session

PROMPTS = {
    "chat": "Give me three tips for staying focused while studying at home.",
    "chat2": "What is the difference between weather and climate? Answer briefly.",
    "code": "Write a Python function `is_palindrome(s)` that ignores case and spaces, with a docstring and two examples.",
    "code2": "Rewrite this function with type hints and a docstring:\n\ndef area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)",
    "summarize": (
        "Summarize the following passage in two sentences.\n\n"
        "The city council met on Tuesday to discuss the new bicycle lanes on Main Street. "
        "Supporters said the lanes made cycling safer and brought more customers to local shops. "
        "Opponents said the lanes removed parking spaces and slowed down delivery trucks. "
        "After two hours of debate, the council voted to keep the lanes for another year and to "
        "study their effect on traffic and on local businesses."
    ),
    "math": "A shop sells pencils at 3 for $1. How much do 12 pencils cost? Explain step by step.",
}


@dataclass(frozen=True)
class Method:
    name: str
    kind: str  # "ours" or "hf"
    options: dict
    reference_dtype: bool = False  # runs on the float32 copy of the target (--compare-float32)


def methods(k: int | str, with_sweep: bool, compare_float32: bool = False) -> list[Method]:
    lookup_k = k if isinstance(k, int) else 4
    listed = [
        Method("hf-plain", "hf", {}),
        Method("plain", "ours", {"draft": "none"}),
        Method(f"hf-prompt-lookup(k={lookup_k})", "hf",
               {"prompt_lookup_num_tokens": lookup_k, "max_matching_ngram_size": 3}),
        Method("ngram-strict", "ours", {"draft": "ngram", "verify": "strict"}),
    ]
    if compare_float32:  # the same target loaded in float32, interleaved with the rest
        listed += [Method("hf-plain(float32)", "hf", {}, reference_dtype=True),
                   Method("plain(float32)", "ours", {"draft": "none"}, reference_dtype=True)]
    # None: the threshold comes from the target's calibrated profile (shipped in mars_cli/profiles/)
    for measure, thresholds in (("logit-ratio", (0.85, 0.9, 0.95, None)), ("prob-ratio", (0.3, 0.5, None))):
        for theta in thresholds:
            label = "profile" if theta is None else theta
            listed.append(Method(f"ngram-mars({measure}>{label})", "ours",
                                 {"draft": "ngram", "verify": "mars", "margin": measure, "threshold": theta}))
    # the trained draft head shipped for the target (mars_cli/heads), strict and at the profile threshold
    listed.append(Method("head-strict", "ours", {"draft": "head", "verify": "strict"}))
    listed.append(Method("head-mars(logit-ratio>profile)", "ours", {"draft": "head", "verify": "mars"}))
    # the measured cost model choosing each round's draft length (or a fixed 4 against auto)
    other = 4 if k == "auto" else "auto"
    listed.append(Method(f"ngram-strict(k={other})", "ours", {"draft": "ngram", "verify": "strict", "num_draft": other}))
    listed.append(Method(f"head-strict(k={other})", "ours", {"draft": "head", "verify": "strict", "num_draft": other}))
    if with_sweep:
        for sweep_k in (2, 3, 6, 8):
            if sweep_k != k:
                listed.append(Method(f"ngram-strict(k={sweep_k})", "ours",
                                     {"draft": "ngram", "verify": "strict", "num_draft": sweep_k}))
    return listed


def run_hf(target, prompt_ids: list[int], max_new: int, extra: dict) -> tuple[list[int], float]:
    ids = torch.tensor([prompt_ids], device=target.device)
    start = time.perf_counter()
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=max_new, pad_token_id=target.tokenizer.eos_token_id, **extra)
    return out[0, len(prompt_ids):].tolist(), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--num-draft", type=lambda v: v if v == "auto" else int(v), default=4,
                        help="draft length of the main methods: a number or 'auto' (the cost model)")
    parser.add_argument("--dtype", default="auto", help="the target's dtype (auto: measured, as `mars --dtype auto`)")
    parser.add_argument("--compare-float32", action="store_true",
                        help="also run plain decoding (ours and transformers') on a float32 copy of the target")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-sweep", action="store_true", help="skip the num-draft sweep")
    parser.add_argument("--prompts", default=",".join(PROMPTS), help="comma-separated prompt names")
    parser.add_argument("--only", default=None,
                        help="comma-separated method names to run (plain, hf-plain and ngram-strict always run)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/decoding.json"))
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    target = load_model(args.target, device="cpu", dtype=args.dtype)
    reference = load_model(args.target, device="cpu", dtype="float32") if args.compare_float32 else None
    base = DecodingOptions.of(target=args.target, max_new_tokens=args.max_new_tokens, num_draft=args.num_draft,
                              dtype=args.dtype)
    listed = methods(args.num_draft, not args.no_sweep, args.compare_float32)
    if args.only:
        keep = {"plain", "hf-plain", "ngram-strict", *args.only.split(",")}
        listed = [m for m in listed if m.name in keep or m.reference_dtype]

    def model_of(method: Method):
        return reference if method.reference_dtype else target

    sessions = {m.name: Session(base.replace(**m.options), target=model_of(m))
                for m in listed if m.kind == "ours"}
    thresholds = {name: {"value": s.threshold.value, "source": s.threshold.source}
                  for name, s in sessions.items() if s.options.verification.verify == "mars"}
    encoder = sessions["plain"]
    prompt_names = args.prompts.split(",")
    prompt_ids = {name: encoder.encode(PROMPTS[name]) for name in prompt_names}

    # warm-up: every method once on a short run
    for method in listed:
        if method.kind == "hf":
            run_hf(model_of(method), prompt_ids[prompt_names[0]], 8, method.options)
        else:
            sessions[method.name].run(prompt_ids[prompt_names[0]][:])

    records: dict[str, dict[str, list]] = {m.name: {} for m in listed}
    rss_trace = [rss_mb()]
    for repeat in range(args.repeats):
        for index, name in enumerate(prompt_names):
            order = listed if (index + repeat) % 2 == 0 else list(reversed(listed))  # A B / B A
            for method in order:
                if method.kind == "hf":
                    tokens, wall = run_hf(model_of(method), prompt_ids[name], args.max_new_tokens, method.options)
                    stats = {"new_tokens": len(tokens), "wall_s": wall}
                else:
                    result = sessions[method.name].run(prompt_ids[name])
                    tokens, stats = result.token_ids, result.stats.summary()
                records[method.name].setdefault(name, []).append({"tokens": tokens, "stats": stats})
                rss_trace.append(rss_mb())
            print(f"repeat {repeat} prompt {name} done", file=sys.stderr, flush=True)

    reference = {name: records["ngram-strict"][name][0]["tokens"] for name in prompt_names}
    plain_reference = {name: records["hf-plain"][name][0]["tokens"] for name in prompt_names}
    float32_reference = ({name: records["hf-plain(float32)"][name][0]["tokens"] for name in prompt_names}
                         if args.compare_float32 else None)

    def tokens_per_s(method: str) -> float:
        # total tokens / total time per repeat, median over repeats
        per_repeat = []
        for repeat in range(args.repeats):
            tokens = sum(records[method][n][repeat]["stats"]["new_tokens"] for n in prompt_names)
            wall = sum(records[method][n][repeat]["stats"]["wall_s"] for n in prompt_names)
            per_repeat.append(tokens / wall)
        return statistics.median(per_repeat)

    plain_tps = tokens_per_s("plain")
    hf_tps = tokens_per_s("hf-plain")
    rows = []
    for method in listed:
        runs = [records[method.name][n][0] for n in prompt_names]
        own_greedy = float32_reference if method.reference_dtype else plain_reference
        row = {
            "method": method.name,
            "tokens_per_s": tokens_per_s(method.name),
            "speedup_vs_plain": tokens_per_s(method.name) / plain_tps,
            "speedup_vs_hf_plain": tokens_per_s(method.name) / hf_tps,
            # greedy identity: against transformers' plain greedy output in the method's own dtype
            "identical_to_greedy": all(r["tokens"] == own_greedy[n] for r, n in zip(runs, prompt_names)),
            "identical_prompts": sum(r["tokens"] == own_greedy[n] for r, n in zip(runs, prompt_names)),
            "prompts": len(prompt_names),
            "token_agreement": statistics.mean(token_agreement(r["tokens"], reference[n]) for r, n in zip(runs, prompt_names)),
            "common_prefix": statistics.mean(common_prefix(r["tokens"], reference[n]) for r, n in zip(runs, prompt_names)),
            "rouge_l": statistics.mean(rouge_l(r["tokens"], reference[n]) for r, n in zip(runs, prompt_names)),
        }
        if float32_reference is not None:
            row["identical_to_float32_prompts"] = sum(r["tokens"] == float32_reference[n]
                                                      for r, n in zip(runs, prompt_names))
            row["token_agreement_vs_float32"] = statistics.mean(token_agreement(r["tokens"], float32_reference[n])
                                                                for r, n in zip(runs, prompt_names))
        if method.kind == "ours":
            totals = [r["stats"] for r in runs]
            rounds = sum(s["rounds"] for s in totals)
            new = sum(s["new_tokens"] for s in totals)
            drafted = sum(s["drafted"] for s in totals)
            row.update(
                tau=new / rounds,
                acceptance_rate=sum(s["accepted"] for s in totals) / drafted if drafted else 0.0,
                relaxed=sum(s["relaxed"] for s in totals),
                mean_logprob=sum(s["mean_logprob"] * s["new_tokens"] for s in totals) / new,
                per_prompt_speedup={n: (r["stats"]["new_tokens"] / r["stats"]["wall_s"]) /
                                    (records["plain"][n][0]["stats"]["new_tokens"] / records["plain"][n][0]["stats"]["wall_s"])
                                    for r, n in zip(runs, prompt_names)},
                time_share={k: sum(s["time_s"][k] for s in totals) / sum(s["wall_s"] for s in totals)
                            for k in totals[0]["time_s"]},
            )
        rows.append(row)
    strict_tau = next(r["tau"] for r in rows if r["method"] == "ngram-strict")
    for row in rows:
        if "tau" in row:
            row["tau_ratio_vs_strict"] = row["tau"] / strict_tau

    result = {
        "command": " ".join(["python"] + sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.processor() or platform.machine()}, {args.threads} threads",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "target": args.target,
        "dtype": str(target.dtype).replace("torch.", ""),
        "max_new_tokens": args.max_new_tokens,
        "num_draft": args.num_draft,
        "prompts": prompt_names,
        "repeats": args.repeats,
        "rss_mb_trace": rss_trace,
        "thresholds": thresholds,
        "rows": rows,
        "outputs": {m: {n: records[m][n][0]["tokens"] for n in prompt_names} for m in records},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(markdown_table(rows))


def markdown_table(rows: list[dict]) -> str:
    lines = ["| method | tok/s | vs plain | vs hf plain | tau | tau vs strict | accept | relaxed | identical | token agr. | ROUGE-L | mean logprob |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def fmt(key: str, spec: str = ".2f") -> str:
            return format(r[key], spec) if key in r else "-"
        lines.append(f"| {r['method']} | {r['tokens_per_s']:.2f} | {r['speedup_vs_plain']:.3f} | {r['speedup_vs_hf_plain']:.3f} | "
                     f"{fmt('tau')} | {fmt('tau_ratio_vs_strict', '.3f')} | {fmt('acceptance_rate', '.1%')} | {r.get('relaxed', '-')} | "
                     f"{r['identical_prompts']}/{r['prompts']} | {r['token_agreement']:.3f} | {r['rouge_l']:.3f} | {fmt('mean_logprob', '.3f')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
