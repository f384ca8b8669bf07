"""`mars eval`: run methods over suites on one loaded target, interleaved per sample, and
aggregate speed and quality. Finished samples are appended to samples.jsonl as they complete
(flushed and fsynced), so an interrupted run keeps them and `--resume` continues it."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..decoding.stats import DecodeStats
from ..decoding.verifiers import Verifier
from ..errors import UserError, require
from ..paths import create_directory, write_atomic
from ..options import DecodingOptions
from ..session import Session
from . import execution
from .metrics import chrf, exact_number, extract_code, rouge_l, token_agreement, words
from .suites import Sample, Suite

BASE_METHODS = {
    "vanilla": {"draft": "none", "verify": "strict"},
    "strict": {"verify": "strict"},
    "mars": {"verify": "mars"},
}


@dataclass(frozen=True)
class Method:
    name: str
    changes: dict


def parse_sweep(text: str) -> list[float]:
    try:
        start, stop, step = (float(part) for part in text.split(":"))
    except ValueError:
        raise UserError(f"--sweep {text!r}: expected START:STOP:STEP, e.g. 0.80:0.98:0.02") from None
    if not (0 < start <= stop <= 1) or step <= 0:
        raise UserError(f"--sweep {text!r}: thresholds must satisfy 0 < START <= STOP <= 1 and STEP > 0")
    count = int(round((stop - start) / step)) + 1
    return [round(start + i * step, 6) for i in range(count) if start + i * step <= stop + 1e-9]


def parse_tree_shape(text: str) -> dict:
    """`TOPKxTOKENS` (e.g. 4x16) or `1` (a chain) -> the drafting changes it stands for."""
    topk, _, tokens = text.strip().partition("x")
    try:
        shape = {"draft_topk": int(topk)} if not tokens and int(topk) == 1 else \
            {"draft_topk": int(topk), "draft_tokens": int(tokens)}
    except ValueError:
        raise UserError(f"tree shape {text!r}: expected TOPKxTOKENS (e.g. 4x16) or 1 for a chain") from None
    return shape


def _shape_of(name: str) -> tuple[str, str | None]:
    """A method name without its `+SHAPE` suffix, and the shape (None when it has none)."""
    spec, plus, shape = name.rpartition("+")
    if plus and re.fullmatch(r"\d+(x\d+)?", shape):
        return spec, shape
    return name, None


def parse_tree_sweep(text: str) -> list[str]:
    shapes = [part.strip() for part in text.split(",") if part.strip()]
    require(bool(shapes), f"--sweep-tree {text!r}: expected shapes like 1,4x8,4x16")
    for shape in shapes:
        parse_tree_shape(shape)
    return shapes


def parse_methods(text: str, sweep: list[float], tree_sweep: list[str] | None = None) -> list[Method]:
    """`rule` or `rule:drafter` (e.g. strict:ngram, mars:head) so drafters compare in one run;
    `+SHAPE` fixes a method's draft tree (strict:head+4x16, strict+1 for a chain). `tree_sweep`
    adds every non-vanilla method at each shape."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if tree_sweep:
        names += [f"{name}+{shape}" for name in list(names) if name != "vanilla" and _shape_of(name)[1] is None
                  for shape in tree_sweep]
    unknown = [name for name in names if _shape_of(name)[0].partition(":")[0] not in BASE_METHODS]
    if unknown:
        raise UserError(f"unknown method {unknown[0]!r}: choose from {', '.join(BASE_METHODS)}, "
                        f"optionally with :DRAFTER (e.g. strict:head)")
    if "vanilla" not in names:
        names.insert(0, "vanilla")  # every speedup and agreement figure is measured against it
    methods = []
    for name in dict.fromkeys(names):
        spec, shape = _shape_of(name)
        rule, _, drafter = spec.partition(":")
        require(not (rule == "vanilla" and (drafter or shape)), f"method {name!r}: vanilla decodes without a drafter")
        tree = parse_tree_shape(shape) if shape else {}
        methods.append(Method(name, {**BASE_METHODS[rule], **({"draft": drafter} if drafter else {}), **tree}))
    methods += [Method(f"mars@{theta:g}", {"verify": "mars", "threshold": theta}) for theta in sweep]
    return methods


# --------------------------------------------------------------------------- scoring
def task_score(suite: Suite, sample: Sample, output: str, allow_execution: bool, strict: bool = True) -> float | None:
    """The sample's task metric, or None when it has no reference for it (or its code may not
    run). `strict=False` runs generated code with the weaker isolation of --weak-sandbox."""
    reference = sample.reference
    if suite.metric == "exact_number" and "answer" in reference:
        return exact_number(output, reference["answer"])
    if suite.metric == "rouge_l" and "reference" in reference:
        return rouge_l(words(output), words(reference["reference"]))
    if suite.metric == "chrf" and "reference" in reference:
        return chrf(output.strip(), reference["reference"])
    if suite.metric == "tests" and allow_execution and "test" in reference:
        test = reference["test"]
        if reference.get("entry_point") and "def check(" in test:  # a HumanEval-style test of the user's own
            test = f"{test}\n\ncheck({reference['entry_point']})"
        return float(execution.check_function(extract_code(output), test, strict=strict).passed)
    if suite.metric == "pass@1" and allow_execution:
        outcome = execution.check_completion(reference["prompt"], output, reference["test"], reference["entry_point"],
                                             strict=strict)
        return float(outcome.passed)
    return None


# --------------------------------------------------------------------------- running
class SampleLog:
    """samples.jsonl: one line per finished (suite, sample, method), durable once written."""

    KEY = ("suite", "sample_id", "method")

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.records: list[dict] = []
        if path is not None and path.exists():
            self._load(path)

    def _load(self, path: Path) -> None:
        """Read the finished samples. A line cut short by a crash (normally the last one) is
        dropped from the file, and reported, before anything is appended after it, so no record
        is ever glued to partial bytes; a record seen twice counts once (and is kept once)."""
        data = path.read_bytes()
        lines = data.split(b"\n")
        dropped, duplicates, seen, last_torn = 0, 0, set(), False
        for index, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                key = tuple(record[k] for k in self.KEY)
            except (ValueError, KeyError, TypeError):
                dropped += 1
                last_torn = index == len(lines) - 1  # no newline after it: its write was cut short
                continue
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            self.records.append(record)
        if dropped == 1 and last_torn and not duplicates:
            with open(path, "r+b") as handle:  # the usual case: cut the torn tail off in place
                handle.truncate(len(data) - len(lines[-1]))
                os.fsync(handle.fileno())
        elif dropped or duplicates:
            write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records))
        if dropped:
            print(f"mars: dropped {dropped} torn line{'s' if dropped > 1 else ''} of {path} (an interrupted write); "
                  f"{'its sample runs' if dropped == 1 else 'their samples run'} again", file=sys.stderr)

    def done(self) -> set[tuple[str, str, str]]:
        return {(r["suite"], r["sample_id"], r["method"]) for r in self.records}

    def append(self, record: dict) -> None:
        self.records.append(record)
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def build_sessions(base: DecodingOptions, methods: list[Method], target) -> dict[str, Session]:
    """One session per method over the same loaded target (and the same draft model)."""
    sessions: dict[str, Session] = {}
    draft_model = None
    for method in methods:
        options = base.replace(**method.changes)
        sessions[method.name] = Session(options, target=target, draft_model=draft_model)
        draft_model = draft_model or sessions[method.name].draft_model
    return sessions


def encode_turn(session: Session, sample: Sample, messages: list[dict]) -> list[int]:
    """Completion prompts (HumanEval) go in raw; everything else through the chat template."""
    return session.encode(messages[-1]["content"]) if sample.raw else session.encode_messages(messages)


def run_sample(session: Session, sample: Sample, repeats: int,
               observe: Callable[[torch.Tensor], None] | None = None, verifier: Verifier | None = None) -> dict:
    """Decode every turn of a sample `repeats` times; keep the first outputs, the median wall.
    `observe` sees the target's logits at every emitted position and `verifier` replaces the
    session's (calibration's sweep records the one and varies the other)."""
    walls, first = [], None
    for _ in range(repeats):
        messages: list[dict] = []
        turns, totals = [], DecodeStats()
        wall = 0.0
        for turn in sample.turns:
            messages.append({"role": "user", "content": turn})
            ids = encode_turn(session, sample, messages)
            stop = sample.stop or session.options.stop
            settings = dataclasses.replace(session.settings(), stop_strings=stop)
            result = session.run(ids, observe=observe if first is None else None, settings=settings,
                                 verifier=verifier)
            text = _trim_at_stop_string(result.text, stop)
            turns.append({"text": text, "token_ids": result.token_ids})
            messages.append({"role": "assistant", "content": text})
            totals.merge(result.stats)
            wall += result.stats.wall_s
        walls.append(wall)
        if first is None:
            first = (turns, totals)
    turns, totals = first
    summary = totals.summary()
    return {
        "output": "\n".join(t["text"] for t in turns) if len(turns) > 1 else turns[0]["text"],
        "turns": [t["text"] for t in turns] if len(turns) > 1 else None,
        "token_ids": [i for t in turns for i in t["token_ids"]],
        "new_tokens": totals.new_tokens,
        "rounds": totals.rounds,
        "drafted": totals.drafted,
        "accepted": totals.accepted,
        "relaxed": totals.relaxed,
        "drafted_at": totals.drafted_at,
        "accepted_at": totals.accepted_at,
        "sum_logprob": totals.sum_logprob,
        "wall_s": statistics.median(walls),
        "walls": walls,
        "mean_accepted": summary["mean_accepted"],
        "accepted_per_round": {str(n): count for n, count in sorted(totals.accepted_per_round.items())},
    }


def _trim_at_stop_string(text: str, stops: tuple[str, ...]) -> str:
    """The text before the first stop string: the loop stops on whole tokens, and the token that
    completes a stop string may carry text past it."""
    cut = min((text.find(s) for s in stops if s and s in text), default=-1)
    return text[:cut] if cut >= 0 else text


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def evaluate(
    suites: list[Suite],
    methods: list[Method],
    sessions: dict[str, Session],
    log: SampleLog,
    repeats: int,
    allow_execution: bool,
    advance: Callable[[str], None],
    strict_sandbox: bool = True,
) -> None:
    """Run everything not yet in the log; methods rotate per sample (A B C, B C A, ...)."""
    done = log.done()
    warmed: set[str] = set()
    for suite in suites:
        for index, sample in enumerate(suite.samples):
            order = methods[index % len(methods):] + methods[:index % len(methods)]
            for method in order:
                if (suite.name, sample.id, method.name) in done:
                    advance(method.name)
                    continue
                session = sessions[method.name]
                if method.name not in warmed:  # first calls pay for allocation: keep them out of timings
                    short = dataclasses.replace(session.settings(), max_new_tokens=4)
                    first_turn = [{"role": "user", "content": sample.turns[0]}]
                    session.run(encode_turn(session, sample, first_turn), settings=short)
                    warmed.add(method.name)
                device = session.target.output_device
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                record = run_sample(session, sample, repeats)
                record.update(suite=suite.name, sample_id=sample.id, method=method.name, rss_mb=rss_mb(),
                              task_score=task_score(suite, sample, record["output"], allow_execution, strict_sandbox))
                if device.type == "cuda":
                    record["cuda_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
                log.append(record)
                advance(method.name)


# --------------------------------------------------------------------------- output directory
def prepare_out_dir(out_dir: Path | None, resume: bool, signature: dict) -> Path | None:
    """Never overwrite a previous run's samples; --resume only continues the same run."""
    if out_dir is None:
        require(not resume, "--resume needs --out DIR (the directory of the run to continue)")
        return None
    require(not out_dir.is_file(), f"--out {out_dir} is a file; name a directory")
    create_directory(out_dir)
    require(os.access(out_dir, os.W_OK), f"cannot write to {out_dir}")
    run_file, samples = out_dir / "run.json", out_dir / "samples.jsonl"
    if resume:
        require(run_file.is_file(), f"nothing to resume in {out_dir} (no run.json)")
        try:
            previous = json.loads(run_file.read_text())
        except ValueError:
            raise UserError(f"{run_file} is corrupt; start a new run in another directory") from None
        require(previous == json.loads(json.dumps(signature)),
                f"--resume: the options differ from the run in {out_dir}; use the same ones or another --out")
    else:
        require(not samples.exists(), f"{out_dir} already holds a run: pass --resume to continue it, or use another --out")
        write_atomic(run_file, json.dumps(signature, indent=1))
    return samples


# --------------------------------------------------------------------------- aggregation
def aggregate(records: list[dict], methods: list[Method], suites: list[str]) -> dict:
    """Per suite and overall: one row per method, speed and quality side by side."""
    table: dict[str, list[dict]] = {}
    for scope in [*suites, "all"] if len(suites) > 1 else suites:
        chosen = [r for r in records if scope == "all" or r["suite"] == scope]
        vanilla = {(r["suite"], r["sample_id"]): r for r in chosen if r["method"] == "vanilla"}
        rows = []
        for method in methods:
            mine = [r for r in chosen if r["method"] == method.name]
            if not mine:
                continue
            rows.append(_row(method.name, mine, vanilla))
        base = next((row for row in rows if row["method"] == "vanilla"), None)
        for row in rows:
            row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"] if base and base["tokens_per_s"] else None
        table[scope] = rows
    return table


def _histogram(counts) -> dict[str, int]:
    """Rounds by accepted drafts (a tree's accepted depth), summed over samples."""
    total: dict[int, int] = {}
    for count in counts:
        for n, rounds in count.items():
            total[int(n)] = total.get(int(n), 0) + rounds
    return {str(n): total[n] for n in sorted(total)}


def _row(name: str, mine: list[dict], vanilla: dict) -> dict:
    tokens = sum(r["new_tokens"] for r in mine)
    wall = sum(r["wall_s"] for r in mine)
    drafted = sum(r["drafted"] for r in mine)
    accepted = sum(r["accepted"] for r in mine)
    positions = max((len(r["drafted_at"]) for r in mine), default=0)
    drafted_at = [sum(r["drafted_at"][i] for r in mine if i < len(r["drafted_at"])) for i in range(positions)]
    accepted_at = [sum(r["accepted_at"][i] for r in mine if i < len(r["accepted_at"])) for i in range(positions)]
    paired = [(r, vanilla[(r["suite"], r["sample_id"])]) for r in mine if (r["suite"], r["sample_id"]) in vanilla]
    scores = [r["task_score"] for r in mine if r.get("task_score") is not None]
    return {
        "method": name,
        "samples": len(mine),
        "new_tokens": tokens,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "tau": tokens / max(1, sum(r["rounds"] for r in mine)),
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "relaxed_share": sum(r["relaxed"] for r in mine) / accepted if accepted else 0.0,
        "per_position_acceptance": [a / d if d else 0.0 for a, d in zip(accepted_at, drafted_at)],
        "accepted_length_histogram": _histogram(r.get("accepted_per_round", {}) for r in mine),
        "task_metric": statistics.mean(scores) if scores else None,
        "agreement_tokens": statistics.mean(token_agreement(r["token_ids"], v["token_ids"]) for r, v in paired) if paired else None,
        "agreement_rouge_l": statistics.mean(rouge_l(r["token_ids"], v["token_ids"]) for r, v in paired) if paired else None,
        "mean_logprob": sum(r["sum_logprob"] for r in mine) / tokens if tokens else 0.0,
        "peak_rss_mb": max(r["rss_mb"] for r in mine),
        **({"cuda_peak_mb": max(r["cuda_peak_mb"] for r in mine)} if "cuda_peak_mb" in mine[0] else {}),
    }


def check_gates(rows: list[dict], min_speedup: float | None, max_quality_drop: float | None) -> list[str]:
    """Failures, each a sentence naming the method and the figure; empty when all pass."""
    failures = []
    base = next((row for row in rows if row["method"] == "vanilla"), None)
    for row in rows:
        if row["method"] == "vanilla":
            continue
        if min_speedup is not None and (row["speedup"] or 0.0) < min_speedup:
            failures.append(f"{row['method']}: speedup {row['speedup']:.3f}x < {min_speedup}x")
        if max_quality_drop is None:
            continue
        if base and base["task_metric"] is not None and row["task_metric"] is not None:
            drop = base["task_metric"] - row["task_metric"]
            if drop > max_quality_drop:
                failures.append(f"{row['method']}: task metric drops by {drop:.3f} > {max_quality_drop}")
        if row["agreement_rouge_l"] is not None and 1 - row["agreement_rouge_l"] > max_quality_drop:
            failures.append(f"{row['method']}: agreement with vanilla (ROUGE-L) {row['agreement_rouge_l']:.3f} "
                            f"is more than {max_quality_drop} below 1")
    return failures
