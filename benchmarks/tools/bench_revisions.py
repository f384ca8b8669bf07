"""A/B two revisions of the decoding loop in one process: does a refactor slow decoding down?

Each revision's `mars_cli` package is extracted with `git archive` under its own name (the package
imports itself relatively, so a renamed copy is self-contained). One target is loaded once and
shared; each revision builds its own session over it; runs alternate A B / B A per prompt and
repeat. Reported per method and revision: tokens/s (total tokens over total decoding time) and
the share of wall time outside target forwards, drafting and prefill (the loop's overhead).

    python benchmarks/tools/bench_revisions.py HEAD~1 HEAD --out benchmarks/results/ab-issue13.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_decoding import PROMPTS  # noqa: E402  (the decoding benchmark's prompts)

# `default`: what `mars generate` does with no flags (its drafter, draft shape and length from the cost model)
METHODS = {"plain": {"draft": "none"}, "ngram-strict": {"draft": "ngram", "verify": "strict"},
           "default": {"draft": "auto", "num_draft": "auto"},
           "default-mars": {"draft": "auto", "num_draft": "auto", "verify": "mars"},  # at the shipped profile
           # a fixed shape, no chooser: in float32 both revisions decode the same rounds, so only their costs differ
           "head-tree": {"draft": "head", "num_draft": 4, "draft_topk": 4, "draft_tokens": 8}}


def extract(revision: str, into: Path) -> str:
    """`mars_cli` at `revision` as an importable package named mars_cli_<n>; returns its name."""
    name = f"mars_cli_{len(list(into.iterdir()))}"
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "mars_cli"], check=True,
                             capture_output=True).stdout
    scratch = into / f"{name}.src"
    scratch.mkdir()
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    shutil.move(str(scratch / "mars_cli"), str(into / name))
    return name


def session_for(package: str, target, options: dict, max_new_tokens: int):
    """A Session of that revision: the options API changed in issue 13 (grouped, `.of`)."""
    try:
        options_module = importlib.import_module(f"{package}.options")
        session_module = importlib.import_module(f"{package}.session")
        made = options_module.DecodingOptions.of(max_new_tokens=max_new_tokens, **{"num_draft": 4, **options})
    except ModuleNotFoundError:
        session_module = importlib.import_module(f"{package}.runner")
        made = session_module.DecodingOptions(max_new_tokens=max_new_tokens, **{"num_draft": 4, **options})
    return session_module.Session(made, target=target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated, from " + ", ".join(METHODS))
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    methods = {name: METHODS[name] for name in args.methods.split(",")}

    workdir = Path(tempfile.mkdtemp(prefix="mars-ab-"))
    sys.path.insert(0, str(workdir))
    packages = {label: extract(revision, workdir) for label, revision in (("a", args.a), ("b", args.b))}
    loader = importlib.import_module(f"{packages['b']}.models")
    target = loader.load_model(args.target, device="cpu", dtype=args.dtype)
    sessions = {(label, method): session_for(package, target, options, args.max_new_tokens)
                for label, package in packages.items() for method, options in methods.items()}
    encode = sessions[("b", "plain")]
    prompts = {name: encode.encode(text) for name, text in PROMPTS.items()}
    for session in sessions.values():  # warm-up
        session.run(next(iter(prompts.values())))

    runs: dict[tuple[str, str], list[dict]] = {key: [] for key in sessions}
    outputs: dict[tuple[str, str], dict[str, list[int]]] = {key: {} for key in sessions}
    keys = list(sessions)
    for repeat in range(args.repeats):
        for index, (name, ids) in enumerate(prompts.items()):
            for key in keys if (index + repeat) % 2 == 0 else reversed(keys):
                result = sessions[key].run(ids)
                runs[key].append(result.stats.summary())
                outputs[key][name] = result.token_ids
        print(f"repeat {repeat} done", file=sys.stderr, flush=True)

    rows = []
    for (label, method), summaries in runs.items():
        tokens = sum(s["new_tokens"] for s in summaries)
        wall = sum(s["wall_s"] for s in summaries)
        outside = sum(s["wall_s"] - s["time_s"]["target"] - s["time_s"]["draft"] - s["time_s"]["prefill"]
                      for s in summaries)
        rounds = sum(s["rounds"] for s in summaries)
        rows.append({"revision": args.a if label == "a" else args.b, "method": method, "tokens_per_s": tokens / wall,
                     "tokens_per_round": tokens / rounds, "ms_per_round": 1000 * wall / rounds,
                     "loop_overhead_share": outside / wall,
                     "same_output_as_a": outputs[(label, method)] == outputs[("a", method)]})
    for method in methods:
        a, b = (next(r for r in rows if r["method"] == method and r["revision"] == rev) for rev in (args.a, args.b))
        b["speed_vs_a"] = b["tokens_per_s"] / a["tokens_per_s"]
    print("| method | revision | tok/s | vs A | tokens a round | ms a round | loop overhead | same output as A |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['method']} | {row['revision']} | {row['tokens_per_s']:.2f} | {row.get('speed_vs_a', 1.0):.3f} | "
              f"{row['tokens_per_round']:.2f} | {row['ms_per_round']:.2f} | {row['loop_overhead_share']:.2%} | "
              f"{'yes' if row['same_output_as_a'] else 'no'} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": " ".join(["python"] + sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
                                        "dtype": args.dtype, "rows": rows}, indent=1))
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
