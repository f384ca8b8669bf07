"""A/B two revisions' sampling rule on the same seeds: is a sampled chain accepted as often as before?

After a change to the verification rules (or to how seeds drive sampling).

Each revision's `mars_cli` is extracted as in bench_revisions.py and runs its own loop, drafter and
verifier over one shared target (the embedded SmolLM2-135M in float32) and one shared drafter:
`--drafter model`, the same model in bfloat16 (the same vocabulary, a slightly different
distribution, so drafts are sometimes rejected), or `--drafter head`, the shipped EAGLE-3 head.
Strict sampling at temperature --temperature, chains of --num-draft tokens, the same seeds for
both. Reported per revision: drafted, accepted, the acceptance rate and tau, and whether the two
revisions emitted the same tokens. A revision from before coupled sampling (a torch.Generator
per sequence, `loop.make_generator`) is driven that way; a later one with `PositionNoise`.

    python benchmarks/tools/ab_sampled_acceptance.py 9584737 HEAD --out benchmarks/results/ab-sampled-acceptance.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "benchmarks" / "tools"))
from bench_decoding import PROMPTS  # noqa: E402
from bench_revisions import extract  # noqa: E402


def run_revision(package: str, target, draft, prompts: dict[str, list[int]], seeds: list[int], num_draft: int,
                 max_new_tokens: int, drafter_kind: str = "model", temperature: float = 1.0) -> dict:
    """Decode every prompt under every seed with that revision's own loop; its counters summed."""
    loop = importlib.import_module(f"{package}.decoding.loop")
    drafters = importlib.import_module(f"{package}.decoding.drafters")
    sampling_module = importlib.import_module(f"{package}.decoding.sampling")
    target_module = importlib.import_module(f"{package}.decoding.target")
    verifiers = importlib.import_module(f"{package}.decoding.verifiers")
    stats_module = importlib.import_module(f"{package}.decoding.stats")
    sampling = sampling_module.SamplingParams(temperature=temperature)
    verifier = verifiers.Verifier("strict", sampling=sampling)
    generators = hasattr(loop, "make_generator")  # before coupled sampling
    head = None
    if drafter_kind == "head":
        head_drafter = importlib.import_module(f"{package}.head.drafter")
        head = head_drafter.load_head("head", target)
    totals = {"drafted": 0, "accepted": 0, "new_tokens": 0, "rounds": 0}
    outputs: dict[str, list[int]] = {}
    for seed in seeds:
        for name, ids in prompts.items():
            own = [loop.make_generator(draft.device, seed + 1)] if generators else []
            if head is not None:
                drafter = head_drafter.HeadDrafter(head, target, sampling, *own)
            else:
                drafter = drafters.ModelDrafter(draft, sampling, *own)
            randomness = (loop.make_generator(target.device, seed) if generators
                          else sampling_module.PositionNoise(seed, target.vocab_size))
            stats = stats_module.DecodeStats()
            tokens: list[int] = []
            settings = loop.DecodeSettings(max_new_tokens, num_draft)
            scorer = target_module.TargetScorer(target, drafter.feature_layers)
            for chunk in loop.decode(scorer, drafter, verifier, ids, settings, randomness, stats):
                tokens.extend(chunk)
            outputs[f"{seed}:{name}"] = tokens
            for key in totals:
                totals[key] += getattr(stats, key)
    totals["acceptance_rate"] = totals["accepted"] / totals["drafted"]
    totals["tau"] = totals["new_tokens"] / totals["rounds"]
    return {"totals": totals, "outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--num-draft", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter", choices=("model", "head"), default="model")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    workdir = Path(tempfile.mkdtemp(prefix="mars-ab-"))
    sys.path.insert(0, str(workdir))
    packages = {label: extract(revision, workdir) for label, revision in (("a", args.a), ("b", args.b))}
    loader = importlib.import_module(f"{packages['b']}.models")
    prompts_module = importlib.import_module(f"{packages['b']}.prompts")
    target = loader.load_model(args.target, device="cpu", dtype="float32")
    draft = loader.load_model(args.target, device="cpu", dtype="bfloat16")
    prompts = {name: prompts_module.encode_messages(target.tokenizer, [{"role": "user", "content": text}], False)
               for name, text in PROMPTS.items()}
    seeds = list(range(args.seeds))
    results = {label: run_revision(package, target, draft, prompts, seeds, args.num_draft, args.max_new_tokens,
                                   args.drafter, args.temperature)
               for label, package in packages.items()}
    same = results["a"]["outputs"] == results["b"]["outputs"]
    print("| revision | drafted | accepted | acceptance | tau |")
    print("|---|---|---|---|---|")
    for label, revision in (("a", args.a), ("b", args.b)):
        t = results[label]["totals"]
        print(f"| {revision} | {t['drafted']} | {t['accepted']} | {t['acceptance_rate']:.4f} | {t['tau']:.3f} |")
    print(f"same tokens for every prompt and seed: {'yes' if same else 'no'}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": " ".join(["python"] + sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
            "prompts": len(prompts), "seeds": args.seeds, "drafter": args.drafter, "temperature": args.temperature,
            "same_output": same,
            "rows": [{"revision": rev, **results[label]["totals"]} for label, rev in (("a", args.a), ("b", args.b))],
        }, indent=1))
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
