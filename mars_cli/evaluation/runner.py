"""`mars eval`: run methods over suites on one loaded target, interleaved per sample, and score
each output. Finished samples are appended to samples.jsonl as they complete (flushed and
fsynced), so an interrupted run keeps them and `--resume` continues it. The method list comes
from methods.py; the table from aggregate.py; the gates from results.py."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from pathlib import Path
from typing import Callable

import torch

from ..decoding.stats import DecodeStats
from ..decoding.verifiers import Verifier
from ..errors import UserError, require
from ..paths import DISK_FULL, claim_output, create_directory, disk_full, remove_leftovers, write_atomic
from ..options import DecodingOptions
from ..session import Session
from . import execution
from .methods import Method
from .metrics import chrf, exact_number, extract_code, rouge_l, words
from .suites import Sample, Suite
from ..notes import note


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
        from ..inputs import LOG_LIMIT, read_bytes

        data = read_bytes(path, "sample log", LOG_LIMIT)
        lines = data.split(b"\n")
        dropped, duplicates, seen, last_torn = 0, 0, set(), False
        for index, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                key = tuple(record[k] for k in self.KEY)
                hash(key)  # a list where a name belongs cannot be a key
            except (ValueError, KeyError, TypeError, RecursionError):
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
            note(f"dropped {dropped} torn line{'s' if dropped > 1 else ''} of {path} (an interrupted write); "
                 f"{'its sample runs' if dropped == 1 else 'their samples run'} again")

    def done(self) -> set[tuple[str, str, str]]:
        """The keys already finished, which --resume skips."""
        return {(r["suite"], r["sample_id"], r["method"]) for r in self.records}

    def append(self, record: dict) -> None:
        """Keep the record and make it durable before the next sample starts."""
        self.records.append(record)
        if self.path is None:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:  # a torn last line is dropped by --resume, the lines before it kept
            if exc.errno in DISK_FULL:
                raise disk_full(self.path, exc) from None
            raise


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
        "widths": {str(w): n for w, n in sorted(totals.widths.items())},
    }


def _trim_at_stop_string(text: str, stops: tuple[str, ...]) -> str:
    """The text before the first stop string: the loop stops on whole tokens, and the token that
    completes a stop string may carry text past it."""
    cut = min((text.find(s) for s in stops if s and s in text), default=-1)
    return text[:cut] if cut >= 0 else text


def rss_mb() -> float:
    """Resident memory now (peak where /proc is missing), recorded per sample to catch leaks."""
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
    """Run everything not yet in the log. Methods rotate per sample (A B C, B C A, ...) and, with
    `repeats`, interleave within it (A B C A B C): a slow spell on a shared machine falls on every
    method alike, so the per-sample ratios behind the speedup's interval stay paired."""
    done = log.done()
    warmed: set[str] = set()
    for suite in suites:
        for index, sample in enumerate(suite.samples):
            order = methods[index % len(methods):] + methods[:index % len(methods)]
            pending = [m for m in order if (suite.name, sample.id, m.name) not in done]
            for method in order:
                if method not in pending:
                    advance(method.name)
            for method in pending:
                if method.name not in warmed:
                    _warm_up(sessions[method.name], sample)
                    warmed.add(method.name)
            runs: dict[str, list[dict]] = {m.name: [] for m in pending}
            for repeat in range(repeats):
                for method in pending:
                    session = sessions[method.name]
                    device = session.target.output_device
                    if device.type == "cuda" and repeat == 0:
                        torch.cuda.reset_peak_memory_stats(device)
                    runs[method.name].append(run_sample(session, sample, 1))
                    if repeat < repeats - 1:
                        continue
                    record = _repeated(runs[method.name])
                    record.update(suite=suite.name, sample_id=sample.id, method=method.name, rss_mb=rss_mb(),
                                  task_score=task_score(suite, sample, record["output"], allow_execution,
                                                        strict_sandbox))
                    if device.type == "cuda":
                        record["cuda_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
                    log.append(record)
                    advance(method.name)


def _warm_up(session: Session, sample: Sample) -> None:
    """First use pays for allocation and for what a session measures once (the costs drafting is
    chosen by): a full untimed first turn keeps it out of the timings (a 4-token warm-up left the
    first head sample 4-13x slower than the rest)."""
    first_turn = [{"role": "user", "content": sample.turns[0]}]
    session.run(encode_turn(session, sample, first_turn))


def _repeated(runs: list[dict]) -> dict:
    """One record for a sample's repeated runs: the first run's outputs and counts, the median
    of the walls (every wall kept)."""
    walls = [wall for run in runs for wall in run["walls"]]
    return {**runs[0], "wall_s": statistics.median(walls), "walls": walls}


# --------------------------------------------------------------------------- output directory
def prepare_out_dir(out_dir: Path | None, resume: bool, signature: dict) -> Path | None:
    """Never overwrite a previous run's samples; --resume only continues the same run."""
    if out_dir is None:
        require(not resume, "--resume needs --out DIR (the directory of the run to continue)")
        return None
    require(not out_dir.is_file(), f"--out {out_dir} is a file; name a directory")
    create_directory(out_dir)
    require(os.access(out_dir, os.W_OK), f"cannot write to {out_dir}")
    claim_output(out_dir, "eval")  # a second eval (or --resume) on the same directory stops here
    remove_leftovers(out_dir / "run.json")  # write_atomic's temporaries, from a run killed while writing
    run_file, samples = out_dir / "run.json", out_dir / "samples.jsonl"
    if resume:
        from ..inputs import LOG_LIMIT, check_file, read_text

        require(run_file.exists(), f"nothing to resume in {out_dir} (no run.json)")
        text = read_text(run_file, "run file", LOG_LIMIT)
        try:
            previous = json.loads(text)
        except (ValueError, RecursionError):
            raise UserError(f"{run_file} is corrupt; start a new run in another directory") from None
        if samples.exists() or samples.is_symlink():  # read after the model loads: checked now
            check_file(samples, "sample log", LOG_LIMIT)
        require(previous == json.loads(json.dumps(signature)),
                f"--resume: the options differ from the run in {out_dir}; use the same ones or another --out")
    else:
        require(not samples.exists(), f"{out_dir} already holds a run: pass --resume to continue it, or use another --out")
        write_atomic(run_file, json.dumps(signature, indent=1))
    return samples


# --------------------------------------------------------------------------- the modelled speedup's prices
def cost_curve(sessions: dict[str, Session], records: list[dict]) -> dict | None:
    """This machine's cost of the target forward at every width the run fed (tuning/curve.py:
    measured once, cached, busy-safe), stored with the run so that a later run compared with
    it is priced alike. None where the records carry no widths (another engine's run)."""
    from ..tuning.curve import measured_curve

    widths = sorted({1} | {int(w) for r in records for w in r.get("widths", {})})
    if not sessions or not any(r.get("widths") for r in records):
        return None
    session = next(iter(sessions.values()))
    measured = measured_curve(session.scorer, tuple(widths))
    provenance = measured.provenance
    source = "this machine's cost curve" + (" (cached)" if provenance.cached else "") + (
        f", provisional: {provenance.provisional}" if provenance.provisional else "")
    return {"ms_by_width": {str(w): measured.curve.cost(w) for w in widths}, "source": source}


def run_identity(config: dict, suites: list[Suite], sessions: dict[str, Session] | None,
                 options: DecodingOptions) -> dict:
    """What a baseline must share with this run (baseline.IDENTITY_KEYS): the target's weights
    fingerprint (another engine's: its spec), the draft heads' weights, and the config's rest."""
    from .baseline import identity, module_digest

    if not sessions:
        return identity(config, suites, str(options.model.target), None)
    first = next(iter(sessions.values()))
    heads = {module_digest(head) for s in sessions.values()
             if isinstance(head := getattr(s.drafter, "head", None), torch.nn.Module)}
    return identity(config, suites, first.target.fingerprint, ",".join(sorted(heads)) or None)
