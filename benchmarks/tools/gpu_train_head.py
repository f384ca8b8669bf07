"""Self-distils the EAGLE-3 head on a lent GPU in one sitting: answers, features, training, held-out.

A 2-core CPU gives the head a few thousand steps of 16 answers a session (docs/head.md, steps 6-17);
a GPU gives that many steps of 64 answers in minutes. Within a wall-clock budget this script

1. answers each prompt file with the target (bfloat16, batched `generate`, the same recipe as
   train-head's data step: half sampled at T = 0.8, top-p 0.95, held-out prompts greedy), as many
   files as time allows, in the order given;
2. extracts the head's features (hidden states 2, 15, 27 and the final normed state) in float32,
   kept on the GPU in fp16 (no disk: 2304 values a position, about 11 GB for 2.3M positions);
3. trains arms side by side on the same batches (train-head's loss: soft labels over the draft
   vocabulary, training-time test of `--depth`, 0.8^(d-1) weights, AdamW, warm-up and cosine):
   `same` continues the shipped head (or `--init`'s); `wide` is that head with its MLP `--widen` times wider,
   grown so that it starts as the same function (the new rows of gate/up small and random, the new
   columns of down zero). The number of steps is set from the measured step time to fill the budget;
4. scores every arm (and the head it started from) on the held-out greedy answers of the first prompt file
   (every tenth prompt, never trained on) as train-head does: chain acceptance k = 4 and KL.

Everything lands under `--out`: log.json, and per arm config.json plus the weights in two halves
(`head-1.safetensors`, `head-2.safetensors`: the device tool brings back files of 16 MiB at most;
`join_head` below puts them back together), rewritten at each evaluation so a run cut short
still leaves its last heads; and gen.jsonl.gz, the answers, for later CPU sessions.

    python benchmarks/tools/gpu_train_head.py --prompts mars_cli/data/head_prompts_large.jsonl,more.jsonl \\
        --budget 480 --out $OUT

`--device cpu` with a small `--limit` runs the same code on a CPU (how it is tested before a lease).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gzip
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mars_cli.decoding.target import select_features
from mars_cli.head.data import HELD_OUT_EVERY, Answering, Sequence, _padded, generate, read_generations
from mars_cli.head.drafter import load_head
from mars_cli.head.eagle3 import CONFIG_FILE, WEIGHTS_FILE, Eagle3Head
from mars_cli.head.train import feature_layers, head_loss, held_out_acceptance, held_out_divergence, learning_rate
from mars_cli.models import load_model
from mars_cli.prompts import encode_prompt, is_held_out, load_prompts

HALVES = ("head-1.safetensors", "head-2.safetensors")


class OutOfTime(Exception):
    """Raised from generate's progress callback once the answering share of the budget is spent."""


@dataclass
class Stored:
    """One answer in the feature store: its rows `offset .. offset + length`."""

    source: int  # which prompt file
    sequence: Sequence  # its index in that file is what the held-out rule reads
    offset: int

    @property
    def length(self) -> int:
        return len(self.sequence.ids)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Redraw(Answering):
    """A prompt file's answers again: training prompts only (`select`), each in the mode its first
    answer did not take at draw 2 (so every training prompt has a greedy and a sampled answer),
    sampled afresh at later draws; the per-batch seeds differ from the first draw's."""

    draw: int = 2

    def sampled(self, index: int) -> bool:
        if is_held_out(index, HELD_OUT_EVERY):
            return False
        return self.draw > 2 or not Answering.sampled(self, index)

    @staticmethod
    def select(index: int) -> bool:
        return not is_held_out(index, HELD_OUT_EVERY)


@dataclass(frozen=True)
class PromptFile:
    """One entry of `--prompts`: a file and which draw of its answers (`file.jsonl@2`: the second)."""

    path: Path
    draw: int = 1

    @classmethod
    def parse(cls, spec: str) -> "PromptFile":
        path, _, draw = spec.partition("@")
        return cls(Path(path), int(draw) if draw else 1)

    @property
    def label(self) -> str:
        """What the answers files call it: the file's name, with the draw after the first."""
        return self.path.name if self.draw == 1 else f"{self.path.name}@{self.draw}"

    def answering(self, max_new_tokens: int) -> Answering:
        """train-head's recipe: half sampled at T = 0.8, top-p 0.95, held-out prompts greedy."""
        first = Answering(max_new_tokens=max_new_tokens, sampled_share=0.5, temperature=0.8, top_p=0.95, seed=0)
        if self.draw == 1:
            return first
        return Redraw(**(asdict(first) | {"seed": self.draw - 1}), draw=self.draw)


def seed_answers(target, files: list[PromptFile], sources: list[Path], folder: Path, limit: int,
                 max_new_tokens: int) -> dict:
    """Answers made earlier (this tool's gen.jsonl.gz, or the CPU's, in the same format) put in
    place as each prompt file's resume log, so answering does only the rest: a record counts when
    its `file` is a prompt file's label, its prompt ids are that prompt's as the template encodes
    it now, and its mode is the one this draw gives that index. Returns counts for the log."""
    counts = {"seeded": 0, "answer_tokens": 0, "mismatched": 0, "other_files": 0}
    wanted = {f.label: number for number, f in enumerate(files)}
    records: dict[int, list[dict]] = {number: [] for number in wanted.values()}
    for source in sources:
        opener = gzip.open if source.suffix == ".gz" else open
        with opener(source, "rt", encoding="utf-8") as stream:
            for line in stream:
                record = json.loads(line)
                if record.get("file") in wanted:
                    records[wanted[record["file"]]].append(record)
                else:
                    counts["other_files"] += 1
    for number, found in records.items():
        if not found:
            continue
        entry = files[number]
        prompts, _, _ = load_prompts(entry.path, entry.path, HELD_OUT_EVERY, conversations=True)
        prompts = prompts[:limit] if limit else prompts
        answering = entry.answering(max_new_tokens)
        out = folder / f"gen-{number}.jsonl"
        done = set(read_generations(out))  # indices the resume log holds already
        with out.open("a", encoding="utf-8") as stream:
            for record in found:
                index = record["index"]
                if index in done or index >= len(prompts):
                    continue
                encoded = encode_prompt(target.tokenizer, prompts[index])
                mode = "sampled" if answering.sampled(index) else "greedy"
                if record["prompt_ids"] != encoded or record.get("mode", "greedy") != mode:
                    counts["mismatched"] += 1
                    continue
                stream.write(json.dumps({"index": index, "mode": mode, "prompt_ids": encoded,
                                         "output_ids": record["output_ids"]}) + "\n")
                done.add(index)
                counts["seeded"] += 1
                counts["answer_tokens"] += len(record["output_ids"])
    return counts


def answer_files(target, files: list[PromptFile], limit: int, batch: int, deadline: float,
                 folder: Path, max_new_tokens: int = 256) -> list[list[Sequence]]:
    """Each file's answers, file after file, until `deadline` (a file cut short keeps its finished
    batches)."""
    answered: list[list[Sequence]] = []
    for number, entry in enumerate(files):
        prompts, _, _ = load_prompts(entry.path, entry.path, HELD_OUT_EVERY, conversations=True)
        prompts = prompts[:limit] if limit else prompts
        answering = entry.answering(max_new_tokens)
        select = Redraw.select if entry.draw > 1 else None
        out = folder / f"gen-{number}.jsonl"

        def stop_when_late(stage: str, done: int, total: int) -> None:
            log(f"{entry.label}: {stage} {done}/{total}")
            if time.time() > deadline:
                raise OutOfTime

        while True:
            try:
                generate(target, prompts, out, answering, batch, stop_when_late, select)
            except OutOfTime:
                log(f"answering stopped at the deadline in {entry.label}")
            except torch.OutOfMemoryError:  # long prompts in a wide batch: again, half as wide (it resumes)
                batch = max(1, batch // 2)
                torch.cuda.empty_cache()
                log(f"out of memory: answering {entry.label} on in batches of {batch}")
                continue
            break
        answered.append(sorted(read_generations(out).values(), key=lambda s: s.index))
        if time.time() > deadline:
            break
    return answered


@torch.inference_mode()
def extract(target, answered: list[list[Sequence]], layers, batch: int) -> tuple[torch.Tensor, torch.Tensor, list[Stored]]:
    """(features [positions, F] fp16, tokens [positions], the answers' places), on the target's device."""
    rows = [(source, s) for source, sequences in enumerate(answered) for s in sequences]
    rows.sort(key=lambda item: len(item[1].ids))
    total = sum(len(s.ids) for _, s in rows)
    store = tokens = None
    placed: list[Stored] = []
    offset = 0
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        ids, mask = _padded([s.ids for _, s in chunk], 0, target.device, left=False)
        output = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        hidden = select_features(output.hidden_states, layers)
        if store is None:
            store = torch.empty(total, hidden.shape[-1], dtype=torch.float16, device=target.device)
            tokens = torch.empty(total, dtype=torch.long, device=target.device)
        for row, (source, s) in enumerate(chunk):
            n = len(s.ids)
            store[offset : offset + n] = hidden[row, :n].to(torch.float16)
            tokens[offset : offset + n] = ids[row, :n]
            placed.append(Stored(source, s, offset))
            offset += n
    return store, tokens, placed


def batch_of(picked: list[Stored], store: torch.Tensor, tokens: torch.Tensor, max_length: int):
    """train.make_batch's (tokens, features, validity) for answers in the GPU store, gathered there."""
    device = store.device
    width = min(max_length, max(p.length for p in picked))
    steps = torch.arange(width, device=device)
    offsets = torch.tensor([p.offset for p in picked], device=device)
    lengths = torch.tensor([min(p.length, width) for p in picked], device=device)
    valid = steps[None, :] < lengths[:, None]
    rows = torch.where(valid, offsets[:, None] + steps[None, :], 0)
    feats = store[rows].float() * valid[..., None]
    return tokens[rows] * valid, feats, valid


def widened(head: Eagle3Head, factor: int, target) -> Eagle3Head:
    """`head` with an MLP `factor` times wider that computes the same function: the old rows and
    columns copied, new gate/up rows small and random, new down columns zero."""
    config = dataclasses.replace(head.config, intermediate_size=head.config.intermediate_size * factor)
    wide = Eagle3Head(config, head.fc.in_features // 3).to(head.fc.weight.device)
    old = head.state_dict()
    new = wide.state_dict()
    inner = head.config.intermediate_size
    for name, value in old.items():
        if name.endswith("gate_proj.weight") or name.endswith("up_proj.weight"):
            grown = torch.randn_like(new[name].float()) * 0.02
            grown[:inner] = value.float()
            new[name] = grown
        elif name.endswith("down_proj.weight"):
            grown = torch.zeros_like(new[name].float())
            grown[:, :inner] = value.float()
            new[name] = grown
        else:
            new[name] = value.float() if value.is_floating_point() else value
    wide.load_state_dict(new)
    return wide.attach(target.model)


def save_halves(head: Eagle3Head, folder: Path) -> None:
    """config.json and the fp16 weights in two files under 16 MiB each (lm_head apart)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: (t.to(torch.float16) if t.is_floating_point() else t).contiguous().cpu()
               for name, t in head.state_dict().items()}
    first = {k: v for k, v in tensors.items() if k == "lm_head.weight"}
    second = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    for name, part in zip(HALVES, (first, second)):
        save_file(part, str(folder / (name + ".tmp")), metadata={"format": "pt"})
        (folder / (name + ".tmp")).replace(folder / name)
    (folder / CONFIG_FILE).write_text(json.dumps(head.config.to_json(), indent=2) + "\n")


def join_head(folder: Path, destination: Path) -> None:
    """A head directory (config.json, model.safetensors) from what save_halves wrote."""
    from safetensors.torch import load_file, save_file

    destination.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name in HALVES:
        tensors.update(load_file(str(folder / name)))
    save_file(tensors, str(destination / WEIGHTS_FILE), metadata={"format": "pt"})
    (destination / CONFIG_FILE).write_text((folder / CONFIG_FILE).read_text())


def fp16_copy(head: Eagle3Head, target) -> Eagle3Head:
    """The head as it ships (weights rounded to fp16), for measuring."""
    shipped = Eagle3Head(head.config, head.fc.in_features // 3).to(head.fc.weight.device)
    shipped.load_state_dict({name: value.half().float() if value.is_floating_point() else value
                             for name, value in head.state_dict().items()})
    return shipped.eval().attach(target.model)


def held_view(held: list[Stored], store: torch.Tensor) -> tuple[list[Sequence], dict[int, torch.Tensor]]:
    """train.py's (sequences, features by index) for answers in the GPU store (one prompt file's)."""
    return [p.sequence for p in held], {p.sequence.index: store[p.offset : p.offset + p.length] for p in held}


def measure(head: Eagle3Head, held: list[Stored], store, target_rows, k: int) -> dict:
    """Held-out chain acceptance (k drafts) and KL, as train-head measures them."""
    sequences, features = held_view(held, store)
    figures = held_out_acceptance(head, sequences, features, k, 512, batch_size=32)
    figures.divergence = held_out_divergence(head, sequences, features, 512, target_rows, batch_size=32)
    return asdict(figures) | {"tau": figures.tau, "decoding_tau": figures.decoding_tau}


EPILOG = """inputs:
  --prompts     JSONL prompt files (a `prompt` or `messages` per line, as `mars train-head --prompts`); the
                first file's every tenth prompt is held out (answered greedily, never trained on, scored)
  --answers     gzipped JSONL answers made earlier: {"file", "index", "mode", "prompt_ids", "output_ids"}
                a line, as gen.jsonl.gz below (benchmarks/data/*-answers.jsonl.gz are two of them)
  --init        a head directory (config.json + model.safetensors); default the shipped head
  the target    smollm2-135m, loaded as `mars` loads it (on a bare GPU machine: docs/gpu.md's set-up)

outputs, under --out (rewritten as the run goes, so a run cut short still leaves its last heads):
  log.json      the arguments, device, timings, answers per file, steps, per-step time, held-out KL at
                each check, losses, and the final held-out figures of the start head and of each arm
  gen.jsonl.gz  every answer of this run (and those taken from --answers), for --answers of a later run
  same/, wide/  per arm: config.json and the weights in two halves, head-1.safetensors and
                head-2.safetensors (under 16 MiB each); --join ARM_DIR --out HEAD makes a head directory
  --work        the answers as they are made (gen-N.jsonl per prompt file), what --keep-answers resumes

exit status: 0 when the run ends (at --budget or --max-steps), 2 on a bad argument, 1 on any other failure.
"""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Flags with their defaults (where they have one), and the description and epilog as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        shown = action.default not in (None, False, "", argparse.SUPPRESS) and action.option_strings
        return f"{action.help} (default: %(default)s)" if shown else action.help or ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=EPILOG,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--prompts", help="comma-separated prompt files, answered in this order; FILE@2 answers "
                        "FILE's training prompts again, each in the other mode (@3 and later: sampled afresh); "
                        "required for a run")
    parser.add_argument("--answers", default="",
                        help="comma-separated answers files made earlier (gen.jsonl.gz here, or on a CPU): "
                             "their answers to these prompt files are used, not made again, where the prompt "
                             "ids and the mode still match")
    parser.add_argument("--join", type=Path, help="instead of a run: join the halves an arm's folder holds into a "
                                                 "head directory at --out")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run, the target's load "
                                                                   "included")
    parser.add_argument("--answer-share", type=float, default=0.45,
                        help="share of the budget for answering (answering stops there)")
    parser.add_argument("--reserve", type=float, default=45.0, help="seconds kept for the final measures and saves")
    parser.add_argument("--answer-batch", type=int, default=2048, help="prompts answered together")
    parser.add_argument("--feature-batch", type=int, default=64, help="answers a feature-extraction forward")
    parser.add_argument("--batch", type=int, default=64, help="answers a training step")
    parser.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (5%% warm-up, cosine to 10%%)")
    parser.add_argument("--depth", type=int, default=3, help="training-time-test passes")
    parser.add_argument("--widen", type=int, default=2, help="the `wide` arm's MLP factor (0: no such arm)")
    parser.add_argument("--evals", type=int, default=6, help="held-out KL checks (and saves) during training")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="longest answer")
    parser.add_argument("--answer-dtype", default="bfloat16", help="the target's dtype while answering")
    parser.add_argument("--init", type=Path, help="start from this head directory; without it, the shipped head")
    parser.add_argument("--keep-answers", action="store_true",
                        help="go on from the answers an earlier run on this machine left in --work; "
                             "without it, answer afresh")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-train-head"),
                        help="folder for the answers as they are made")
    parser.add_argument("--limit", type=int, default=0, help="answer only the first N prompts of each file (tests)")
    parser.add_argument("--max-steps", type=int, default=0, help="at most this many steps (tests)")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu (with --limit: how it is tested)")
    parser.add_argument("--out", type=Path, required=True, help="the run's folder (with --join: the head directory)")
    args = parser.parse_args()
    if args.join:
        join_head(args.join, args.out)
        return
    if not args.prompts:
        parser.error("--prompts is required for a run")
    started = time.time()
    deadline = started + args.budget
    args.out.mkdir(parents=True, exist_ok=True)
    record: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "timings": {}, "evals": []}

    def write_log() -> None:
        (args.out / "log.json").write_text(json.dumps(record, indent=1) + "\n")

    torch.manual_seed(0)
    target = load_model("smollm2-135m", device=args.device, dtype="float32")
    record["device"] = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    record["timings"]["load"] = time.time() - started
    log(f"target loaded on {record['device']}")

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    for stale in work.glob("gen-*.jsonl"):
        if not args.keep_answers:
            stale.unlink()
    files = [PromptFile.parse(p) for p in args.prompts.split(",") if p]
    if args.answers:
        record["seeded"] = seed_answers(target, files, [Path(a) for a in args.answers.split(",") if a], work,
                                        args.limit, args.max_new_tokens)
        log(f"answers made earlier: {record['seeded']}")
    exact = target.model  # answers in bfloat16 (as train-head's GPU data was made), features from this
    target.model = copy.deepcopy(exact).to(getattr(torch, args.answer_dtype))
    answered = answer_files(target, files, args.limit, args.answer_batch,
                            started + args.budget * args.answer_share, work, args.max_new_tokens)
    target.model = exact
    record["answers"] = [{"file": f.label, "answers": len(a), "answer_tokens": sum(len(s.output_ids) for s in a)}
                         for f, a in zip(files, answered)]
    record["timings"]["answered"] = time.time() - started
    log(f"answers: {record['answers']}")
    with gzip.open(args.out / "gen.jsonl.gz", "wt", encoding="utf-8") as stream:
        for source, sequences in enumerate(answered):
            for s in sequences:
                stream.write(json.dumps({"file": files[source].label, "index": s.index, "mode": s.mode,
                                         "prompt_ids": s.prompt_ids, "output_ids": s.output_ids}) + "\n")
    write_log()

    if args.device == "cuda":
        torch.cuda.empty_cache()
    layers = feature_layers("eagle3", target.model)
    store, tokens, placed = extract(target, answered, layers, args.feature_batch)
    record["timings"]["features"] = time.time() - started
    record["positions"] = int(store.shape[0])
    log(f"features: {tuple(store.shape)}")

    held = [p for p in placed
            if p.source == 0 and is_held_out(p.sequence.index, HELD_OUT_EVERY) and p.sequence.mode == "greedy"]
    train_rows = [p for p in placed if not is_held_out(p.sequence.index, HELD_OUT_EVERY)]
    watch = held[:: max(1, len(held) // 96)][:96]  # a fixed held-out sample for the KL checks
    record["train_answers"], record["held_out_answers"] = len(train_rows), len(held)

    start = f"head:{args.init}" if args.init else "head"
    initial = load_head(start, target).float().attach(target.model)
    target_rows = target.model.get_output_embeddings().weight.detach()[initial.vocab_ids].float()
    arms = {"same": load_head(start, target).float().attach(target.model)}
    if args.widen > 1:
        arms["wide"] = widened(arms["same"], args.widen, target)
    for head in arms.values():
        head.train()
    fused = {"fused": True} if args.device == "cuda" else {}
    optimizers = {name: torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0,
                                          **fused) for name, head in arms.items()}
    record["before"] = {"start": measure(fp16_copy(initial, target), watch, store, target_rows, 4)}
    write_log()

    rng = random.Random(0)
    order: list[Stored] = []
    step, total, losses = 0, 0, {name: [] for name in arms}
    train_started = time.time()
    best = {name: (math.inf, None) for name in arms}
    next_eval = None
    while True:
        if not order:
            order = train_rows[:]
            rng.shuffle(order)
        picked, order = order[: args.batch], order[args.batch :]
        feature_tokens, feats, valid = batch_of(picked, store, tokens, 512)
        lr = learning_rate(step, total or 10_000, args.lr)
        for name, head in arms.items():
            for group in optimizers[name].param_groups:
                group["lr"] = lr
            with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.device == "cuda"):
                objective, _ = head_loss(head, feature_tokens, feats, valid, args.depth, target_rows, "soft")
            optimizers[name].zero_grad(set_to_none=True)
            objective.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimizers[name].step()
            losses[name].append(float(objective.detach()))
        step += 1
        if step == 10:
            sizing_from = time.time()
        if step in (30, 130) and (not total or step < total):
            # size the run from the measured step time (after warm-up), then again once the
            # allocator has settled (the first sizing read 227 ms a step where 126 ms held)
            per_step = (time.time() - sizing_from) / (step - 10)
            room = deadline - args.reserve - time.time()
            total = max(step + 10, step + int(room / per_step))
            if args.max_steps:
                total = min(total, args.max_steps)
            record["per_step_s"], record["steps"] = per_step, total
            next_eval = [int(total * (i + 1) / args.evals) for i in range(args.evals)]
            log(f"{per_step * 1000:.0f} ms a step: {total} steps")
        if total and (step in (next_eval or []) or step >= total or time.time() > deadline - args.reserve):
            entry = {"step": step, "seconds": time.time() - train_started,
                     "loss": {name: sum(values[-20:]) / len(values[-20:]) for name, values in losses.items()}}
            for name, head in arms.items():
                head.eval()
                kl = held_out_divergence(fp16_copy(head, target), *held_view(watch, store), 512, target_rows,
                                         batch_size=32)
                head.train()
                entry[f"kl_{name}"] = kl
                if kl < best[name][0]:
                    best[name] = (kl, {k: v.detach().clone() for k, v in head.state_dict().items()})
                    save_halves(head, args.out / name)
            record["evals"].append(entry)
            log(json.dumps(entry))
            write_log()
            if step >= total or time.time() > deadline - args.reserve:
                break
    record["timings"]["trained"] = time.time() - started
    record["losses"] = {name: values[:: max(1, len(values) // 200)] for name, values in losses.items()}
    figures = {"start": measure(fp16_copy(initial, target), held, store, target_rows, 4)}
    write_log()
    for name, head in arms.items():
        head.load_state_dict(best[name][1])
        head.eval()
        figures[name] = measure(fp16_copy(head, target), held, store, target_rows, 4)
        record["held_out"] = figures
        write_log()
        log(f"{name}: tau {figures[name]['tau']:.3f} (start {figures['start']['tau']:.3f}), "
            f"KL {figures[name]['divergence']:.3f} (start {figures['start']['divergence']:.3f})")
    record["timings"]["done"] = time.time() - started
    write_log()


if __name__ == "__main__":
    main()
