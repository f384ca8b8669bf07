"""Where the draft head saturates: arms trained with train-head's code, scored on the same held-out answers.

Issue 27: held-out acceptance against training data, epochs, training-time-test depth, loss and
draft vocabulary, one arm at a time on the same answers.

    python benchmarks/head_scaling.py --generations GEN.jsonl --out benchmarks/results/head-scaling \
        --arms "a:tokens=0.25;b:tokens=0.5;c:tokens=1;d:tokens=0.5,depth=6;e:tokens=0.5,loss=hard"

Every arm trains a fresh EAGLE-3 head with `mars train-head`'s own code (`head.train.train`) on a
prefix of one fixed shuffle of the training answers (so a smaller arm's data is inside a larger
one's) and is measured on the same held-out answers: every tenth prompt's greedy answer, as
train-head holds out. Measured: the chain acceptance strict greedy decoding would see (k drafts
from every answer position, from the true features) and KL(target || head) of the first draft.
The baseline head (`--baseline`, by default the one shipped now; the arms in
benchmarks/results/head-scaling ran against the head shipped until 2026-12-01, commit 3beb79f) is
measured on the same answers as the `shipped` row (its held-out prompts are the same ones when the
generations answer `head_prompts_large.jsonl`). Each finished arm is written at once to
`arms.json` (a rerun skips it) and its head under the cache; an interrupted arm resumes from its
checkpoint. `table.md` and `scaling.png` are redrawn after every arm. `--reuse-features OLD.jsonl`
(an earlier study's generations, which these pool with new ones): the answers identical to OLD's
take OLD's cached features, so only the new answers go through the target.

Arm keys: tokens (a share of the training answer tokens, or a count such as 200k), epochs, depth,
loss (soft, hard), vocab, lr, batch, init (`shipped`: the baseline, or a head directory: fine-tune that head,
with its draft vocabulary, instead of training a fresh one). Defaults: the whole set, 1 epoch,
depth 3, soft, 8192, 1e-3, 16 sequences a step, a fresh head.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import sys
import time
from pathlib import Path

import torch

from mars_cli.tuning.machine import machine_facts
from mars_cli.head.data import extract_features, read_generations
from mars_cli.head.drafter import load_head
from mars_cli.head.train import (HeldOut, TrainSettings, feature_layers, held_out_acceptance, held_out_divergence,
                                 split, train)
from mars_cli.models import load_model
from mars_cli.paths import cache_dir

ARM_DEFAULTS = {"tokens": "1", "epochs": "1", "depth": "3", "loss": "soft", "vocab": "8192", "lr": "1e-3",
                "batch": "16", "init": ""}
SHIPPED_HEAD = Path(__file__).resolve().parent.parent / "mars_cli" / "heads" / "smollm2-135m"


def parse_arms(text: str) -> dict[str, dict[str, str]]:
    """"name:key=value,key=value;name2:..." -> {name: settings with the defaults filled in}."""
    arms = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, body = part.partition(":")
        values = dict(ARM_DEFAULTS)
        for pair in filter(None, body.split(",")):
            key, _, value = pair.partition("=")
            if key not in ARM_DEFAULTS:
                raise SystemExit(f"arm {name}: unknown key {key!r} (expected one of {', '.join(ARM_DEFAULTS)})")
            values[key] = value
        arms[name] = values
    return arms


def token_budget(value: str, total: int) -> int:
    """"0.25" -> a share of `total`; "200k" / "1.5M" / "300000" -> a count."""
    value = value.strip().lower()
    scale = {"k": 1e3, "m": 1e6}.get(value[-1:], None)
    if scale:
        return int(float(value[:-1]) * scale)
    number = float(value)
    return int(number * total) if number <= 1 else int(number)


def training_prefix(train_set: list, budget: int, seed: int = 0) -> list:
    """The shortest prefix of one fixed shuffle of the training answers holding `budget` answer tokens."""
    order = list(train_set)
    random.Random(seed).shuffle(order)
    chosen, tokens = [], 0
    for sequence in order:
        if tokens >= budget:
            break
        chosen.append(sequence)
        tokens += len(sequence.output_ids)
    return chosen


def held_figures(held: HeldOut) -> dict:
    return {"tau": round(held.tau, 4), "decoding_tau": round(held.decoding_tau, 4), "per_position": [round(p, 4) for p in held.per_position],
            "rounds": held.rounds, "coverage": round(held.coverage, 4), "kl": round(held.divergence, 4)}


def write_table(results: dict, out: Path) -> None:
    lines = ["| arm | starts from | answer tokens | epochs | depth | loss | vocab | steps | train min "
             "| held-out tau (k=4) | acceptance by position (conditional) | KL first draft (nats) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in results.items():
        start = "-" if name == "shipped" else (row.get("init") or "fresh")
        lines.append(f"| {name} | {start} | {row.get('answer_tokens', '-'):,} | {row.get('epochs', '-')} | {row.get('depth', '-')} "
                     f"| {row.get('loss', '-')} | {row.get('vocab', '-')} | {row.get('steps', '-')} "
                     f"| {row.get('train_minutes', '-')} | {row['tau']:.3f} "
                     f"| {' '.join(f'{p:.2f}' for p in row['per_position'])} | {row['kl']:.3f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")


def tokens_seen(row: dict, results: dict) -> int:
    """Answer tokens times epochs, plus the starting head's when the arm fine-tunes one."""
    seen = row["answer_tokens"] * row.get("epochs", 1)
    if row.get("init") == "shipped" and "shipped" in results:
        seen += tokens_seen(results["shipped"], results)
    return seen


def draw(results: dict, out: Path) -> None:
    """Held-out tau and KL against training answer tokens; arms that differ in more than data
    are single marked points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, row in results.items():
        seen = tokens_seen(row, results)
        for axis, key in ((left, "tau"), (right, "kl")):
            marker = "*" if name == "shipped" else ("s" if row.get("init") else "o")
            axis.scatter(seen, row[key], marker=marker, s=60)
            axis.annotate(name, (seen, row[key]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    for axis, label in ((left, "held-out chain tau (k = 4, strict greedy)"), (right, "KL(target || head), nats")):
        axis.set_xscale("log")
        axis.set_xlabel("answer tokens trained on (x epochs; a fine-tuned head's included)")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    figure.suptitle("EAGLE-3 head for SmolLM2-135M: held-out figures by training recipe")
    figure.tight_layout()
    figure.savefig(out / "scaling.png", dpi=110)
    plt.close(figure)


def remeasure(results: dict, k: int, target, held_greedy: list, features: dict, out: Path, baseline: Path) -> None:
    """Chains of k drafts from every held-out answer position, for every head already trained."""
    measured = {}
    for name, row in results.items():
        location = baseline if name == "shipped" else Path(row["head"])
        if not location.is_dir():
            continue
        head = load_head(f"head:{location}", target)
        measured[name] = held_figures(held_out_acceptance(head, held_greedy, features, k, 512))
        measured[name].pop("kl")  # not measured here (the first draft's KL does not depend on k)
        print(f"{name}: k = {k} tau {measured[name]['tau']:.3f} {measured[name]['per_position']}", flush=True)
    (out / f"arms-k{k}.json").write_text(json.dumps(measured, indent=1) + "\n")


def study_folder(target, sequences: list) -> Path:
    """The cache folder of a study over exactly these answers (features, checkpoints, heads)."""
    key = hashlib.sha256(f"{target.fingerprint}|{[(s.index, len(s.ids)) for s in sequences]}".encode()).hexdigest()[:16]
    return cache_dir() / "heads" / "study" / key


def reused_features(target, sequences: list, earlier: list[Path], layers, batch: int) -> dict:
    """Features an earlier study extracted, for the answers here identical to its own (same prompt
    index, same token ids). A study with no features folder is one sentence; one with some shards
    missing has them extracted first, as a rerun of that study would."""
    by_index = {s.index: s for s in sequences}
    known = {}
    for path in earlier:
        old = sorted(read_generations(path).values(), key=lambda s: s.index)
        folder = study_folder(target, old) / "features"
        if not folder.is_dir():
            raise SystemExit(f"--reuse-features {path}: no study over these answers has cached features")
        stored = extract_features(target, old, folder, batch, None, layers)
        same = {s.index for s in old if s.index in by_index and by_index[s.index].ids == s.ids}
        known.update({index: stored[index] for index in same})
        print(f"reusing the features of {len(same)} answers from {folder}", flush=True)
    return known


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generations", type=Path, required=True, help="generations.jsonl (train-head's format)")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--arms", required=True)
    parser.add_argument("--num-draft", type=int, default=4)
    parser.add_argument("--feature-batch", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--baseline", type=Path, default=SHIPPED_HEAD,
                        help="the head of the `shipped` row, which init=shipped fine-tunes (default: the shipped head)")
    parser.add_argument("--reuse-features", type=Path, action="append", default=[], metavar="OLD.jsonl",
                        help="an earlier study's generations: its cached features serve the identical answers here")
    parser.add_argument("--remeasure", type=int, default=0,
                        help="instead of training: measure every finished arm's head (and the shipped one) with "
                             "chains of this length, into arms-kK.json (deeper than k = 4: what trees reach)")
    args = parser.parse_args()
    arms = parse_arms(args.arms)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "arms.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}

    target = load_model(args.target, device="cpu", dtype="float32")
    sequences = sorted(read_generations(args.generations).values(), key=lambda s: s.index)
    study = study_folder(target, sequences)
    layers = feature_layers("eagle3", target.model)
    started = time.perf_counter()
    known = reused_features(target, sequences, args.reuse_features, layers, args.feature_batch)
    features = extract_features(target, sequences, study / "features", args.feature_batch,
                                lambda stage, done, total: print(f"{stage} {done}/{total}", file=sys.stderr, flush=True),
                                layers, known)
    print(f"features of {len(sequences)} answers ready in {time.perf_counter() - started:.0f} s", flush=True)
    train_set, held_set = split(sequences)
    held_greedy = [s for s in held_set if s.mode == "greedy"]
    total_tokens = sum(len(s.output_ids) for s in train_set)
    machine = {**machine_facts(), "training_answers": len(train_set), "training_answer_tokens": total_tokens,
               "held_out_answers": len(held_greedy), "held_out_answer_tokens": sum(len(s.output_ids) for s in held_greedy)}
    (args.out / "data.json").write_text(json.dumps(machine, indent=1) + "\n")
    print(json.dumps(machine), flush=True)
    target_rows = None

    if args.remeasure:
        remeasure(results, args.remeasure, target, held_greedy, features, args.out, args.baseline)
        return
    if "shipped" not in results and args.baseline.is_dir():  # the same held-out answers, the baseline head
        head = load_head(f"head:{args.baseline}", target)
        target_rows = target.model.get_output_embeddings().weight.detach()[head.vocab_ids].float()
        held = held_out_acceptance(head, held_greedy, features, args.num_draft, 512)
        held.divergence = held_out_divergence(head, held_greedy, features, 512, target_rows)
        recipe = head.config.mars.get("recipe", {}) if isinstance(head.config.mars, dict) else {}
        results["shipped"] = {"answer_tokens": int(recipe.get("answer_tokens", 0)), "epochs": 2, "depth": 3,
                              "loss": "soft", "vocab": head.vocab_ids.numel(), **held_figures(held)}
        results_path.write_text(json.dumps(results, indent=1) + "\n")

    for name, values in arms.items():
        if name in results:
            print(f"{name}: done before, skipped", flush=True)
            continue
        chosen = training_prefix(train_set, token_budget(values["tokens"], total_tokens))
        settings = TrainSettings(architecture="eagle3", epochs=int(values["epochs"]), batch_size=int(values["batch"]),
                                 learning_rate=float(values["lr"]), depth=int(values["depth"]), loss=values["loss"],
                                 vocab=int(values["vocab"]), num_draft=args.num_draft, seed=0)
        checkpoint = study / "checkpoints" / f"{name}.ckpt"
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        options = {"arm": values, "answers": len(chosen)}
        started = time.perf_counter()

        def progress(step: int, total: int, loss: float, name: str = name) -> None:
            if step % 25 == 0 or step == total:
                print(f"{name}: step {step}/{total} loss {loss:.3f} ({time.perf_counter() - started:.0f} s)",
                      file=sys.stderr, flush=True)

        initial = None
        if values["init"]:
            initial = load_head(f"head:{args.baseline if values['init'] == 'shipped' else values['init']}", target)
        # held-out answers ride along for train() to split off and measure (greedy ones only)
        head, held, losses = train(target, chosen + held_set, features, settings, checkpoint, checkpoint.exists(),
                                   {"study": "benchmarks/head_scaling.py", "arm": values}, progress, options, initial)
        minutes = (time.perf_counter() - started) / 60
        head.save_pretrained(study / "heads" / name)
        checkpoint.unlink(missing_ok=True)
        results[name] = {"answer_tokens": sum(len(s.output_ids) for s in chosen), "answers": len(chosen),
                         "init": values["init"] or None,
                         "epochs": settings.epochs, "depth": settings.depth, "loss": settings.loss,
                         "vocab": settings.vocab, "lr": settings.learning_rate, "batch": settings.batch_size,
                         "steps": len(losses), "train_minutes": round(minutes, 1),
                         "final_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4),
                         "head": str(study / "heads" / name), **held_figures(held)}
        results_path.write_text(json.dumps(results, indent=1) + "\n")
        write_table(results, args.out)
        draw(results, args.out)
        print(f"{name}: tau {held.tau:.3f} KL {held.divergence:.3f} in {minutes:.1f} min", flush=True)
    write_table(results, args.out)
    draw(results, args.out)


if __name__ == "__main__":
    main()
