"""The measured-quality objective (`mars calibrate --objective quality=DROP`): sweep theta over a
suite with task metrics and keep the most permissive theta whose quality is clearly within DROP
(no more permissive than the speed it buys).

The loss objective is a bound on what relaxation could cost; this one measures it. Per decoding
mode the target decodes every sample once with strict verification (the reference, whose emitted
positions also feed the loss bound reported beside the fit) and once per theta with MARS, on one
loaded target and one drafter (only the verifier changes between runs, passed to each decoding
call). Each run's per-sample records are `mars eval`'s, and eval's aggregation gives tau, the
relaxed share, the target's mean log-probability and each suite's task metric.

The decision, per theta and quality metric, and the power estimate of the samples a clear
decision needs, are decision.py's (pure functions over these records, documented there): a
theta passes when every metric's drop from strict is clearly (95% paired interval) within DROP;
walking from the strictest theta down, the choice is among the thetas before the first that
does not pass.

`--limit auto` (run_growing): start with DEFAULT_LIMIT samples a suite (the last ones, as a
fixed --limit takes them) and while the walk's decision is unclear, double the samples a suite
(each suite up to its size) and decode only the new samples (the earlier records are kept), then
decide again. The budget: at most AUTO_MAX samples a suite, and per mode AUTO_SECONDS of sweeping:
a round is not started when, at this mode's seconds per sample so far, it would end past that.
Samples are decoded independently (each decoding call is seeded), and the records are kept in a
suite's own order, so a run that grew to N samples a suite decides as `--limit N` does.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import UserError, require
from .collection import TopTwoRecorder
from .decision import LEVEL, assess, decide, per_suite, summarise, theta_decision, theta_power

if TYPE_CHECKING:
    from ..evaluation.suites import Suite
    from ..models import LoadedModel
    from ..session import Session

DEFAULT_SUITES = "math,summarize,translate"
DEFAULT_LIMIT = 4  # samples per suite, from its end (`mars eval --limit N` starts at the front)
DEFAULT_LENGTH = 48  # new tokens per sample: enough for the answer, short enough for 10 minutes
DEFAULT_THETAS = {
    "logit-ratio": (0.80, 0.85, 0.90, 0.94, 0.97),
    "prob-ratio": (0.20, 0.35, 0.50, 0.65, 0.80),
}
STRICT = "strict"
AUTO = "auto"
AUTO_MAX = 32  # --limit auto: at most this many samples a suite
AUTO_SECONDS = 1200.0  # --limit auto: no round that would end past this much sweeping of one mode


# --------------------------------------------------------------------------- inputs
def parse_thetas(text: str) -> tuple[float, ...]:
    """`0.8,0.9,0.95`: distinct thresholds in (0, 1], strictest first in the result."""
    try:
        values = {float(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise UserError(f"--thetas {text!r}: expected comma-separated numbers, e.g. 0.8,0.9,0.95") from None
    require(bool(values) and all(math.isfinite(v) and 0 < v <= 1 for v in values),
            f"--thetas {text!r}: every threshold must be in (0, 1]")
    return tuple(sorted(values, reverse=True))


def parse_limit(text: str | int) -> int | str:
    """`--limit`: a number of samples a suite (at least 1), or `auto` (grow until the decision is
    clear, within the budget: see the module's docstring)."""
    if isinstance(text, int):
        value = text
    elif text.strip().lower() == AUTO:
        return AUTO
    else:
        try:
            value = int(text.strip())
        except ValueError:
            raise UserError(f"--limit {text!r}: expected a number of samples a suite (at least 1) or auto") from None
    require(value >= 1, f"--limit must be at least 1 (or auto), got {value}")
    return value


def quality_suites(spec: str, limit: int | str, allow_code_execution: bool) -> list[Suite]:
    """The suites to sweep over, each cut to its last `limit` samples (`auto`: its last AUTO_MAX,
    of which the sweep decodes what it needs). A suite whose task metric cannot be measured here
    is refused, naming the ones that can."""
    from ..evaluation.suites import BUILTIN, load_suite

    keep = AUTO_MAX if limit == AUTO else limit
    require(isinstance(keep, int) and keep >= 1, f"--limit must be at least 1 (or auto), got {limit}")
    with_metrics = [name for name, metric in BUILTIN.items() if metric is not None]
    names = [part.strip() for part in spec.split(",") if part.strip()]
    require(bool(names), "--suite is empty")
    suites = []
    for name in names:
        suite = load_suite(name)
        measurable = suite.metric is not None and (allow_code_execution or not suite.needs_execution)
        if not measurable:
            why = "is scored by running code: add --allow-code-execution" if suite.metric else "has no task metric"
            raise UserError(f"--objective quality= needs task metrics, and suite {name!r} {why}; suites with "
                            f"them: {', '.join(with_metrics)} (code with --allow-code-execution), or a JSONL "
                            "suite with 'answer', 'reference' or 'test' fields")
        suite.samples = suite.samples[-keep:]
        suites.append(suite)
    return suites


def last_samples(suites: Sequence[Suite], count: int, skip: int = 0) -> list[Suite]:
    """Copies of the suites holding each one's last `count` samples but its last `skip` (in the
    suite's order): the samples a growing sweep adds when it goes from `skip` to `count` a suite."""
    cut = []
    for suite in suites:
        size = len(suite.samples)
        part = copy.copy(suite)
        part.samples = suite.samples[size - min(count, size):size - min(skip, size)]
        cut.append(part)
    return cut



# --------------------------------------------------------------------------- running
def check_drafter(spec: str) -> None:
    """A sweep measures what relaxing drafts costs: plain decoding drafts nothing. Checked when
    the request is read, before the target loads (it once failed only after a 38 s load)."""
    require(spec != "none", "--objective quality= needs a drafter: --draft none relaxes nothing")


def resolve_drafter(spec: str, target: LoadedModel, note: Callable[[str], None]) -> str:
    """`auto`: the target's draft head when it has one (as `--draft auto` decodes), else n-gram
    lookup: plain decoding drafts nothing, so nothing would ever be relaxed."""
    if spec != "auto":
        check_drafter(spec)
        return spec
    from ..head.drafter import find_head

    if find_head(target.fingerprint) is not None:
        return "head"
    note(f"{target.spec} has no draft head: the sweep drafts with n-gram lookup (--draft ngram)")
    return "ngram"


@dataclasses.dataclass
class ModeRun:
    """One mode's sweep: the strict reference records, each theta's records (both `mars eval`'s
    sample records, with the suite's metric named), and the top-two logits of strict's emitted
    positions (the positions this mode visits). `growth`: with --limit auto, each round's samples
    a suite and whether its decision was clear."""

    reference: list[dict]
    runs: dict[float, list[dict]]
    z1: list[list[float]]
    z2: list[list[float]]
    growth: list[dict] | None = None


def run_mode(session: Session, suites: list[Suite], thetas: Sequence[float], measure: str, allow_execution: bool,
             strict_sandbox: bool, advance: Callable[[int], None]) -> ModeRun:
    """Decode every sample strictly, then at each theta, on the session's target and drafter;
    each run gets its verifier per call, so the session itself is left as it was."""
    from ..evaluation.runner import rss_mb, run_sample, task_score

    base = session.verifier
    verifiers = {STRICT: dataclasses.replace(base, rule="strict")}
    verifiers.update({theta: dataclasses.replace(base, rule="mars", threshold=theta, measure=measure)
                      for theta in thetas})
    result = ModeRun([], {theta: [] for theta in thetas}, [], [])
    for suite in suites:
        for sample in suite.samples:
            for key, verifier in verifiers.items():
                recorder = TopTwoRecorder() if key == STRICT else None
                record = run_sample(session, sample, 1, observe=recorder, verifier=verifier)
                record.update(suite=suite.name, sample_id=sample.id, method=_method(key), rss_mb=rss_mb(),
                              task_score=task_score(suite, sample, record["output"], allow_execution, strict_sandbox),
                              metric=f"{suite.name}:{suite.metric}")
                if recorder is not None:
                    z1, z2 = recorder.values()
                    result.z1.append(z1.tolist())
                    result.z2.append(z2.tolist())
                    result.reference.append(record)
                else:
                    result.runs[key].append(record)  # type: ignore[index]
                advance(1)
    return result


def merge(rounds: Sequence[tuple[Sequence[int], ModeRun]]) -> ModeRun:
    """The rounds of a growing sweep as one run in each suite's own order: `rounds` in the order
    they ran, each with its samples per suite; a later round holds samples from further back in
    each suite, so per suite they come first."""
    first = rounds[0][1]
    merged = ModeRun([], {theta: [] for theta in first.runs}, [], [])
    for index in range(len(rounds[0][0])):
        for counts, run in reversed(rounds):
            start = sum(counts[:index])
            part = slice(start, start + counts[index])
            merged.reference += run.reference[part]
            merged.z1 += run.z1[part]
            merged.z2 += run.z2[part]
            for theta, records in run.runs.items():
                merged.runs[theta] += records[part]
    return merged


def next_limit(current: int, sizes: Sequence[int], elapsed: float, decoded: int,
               most: int | None = None, seconds: float | None = None) -> int | None:
    """The next samples a suite of a growing sweep (twice `current`, at most `most`, AUTO_MAX
    unless given), or None when the budget is spent: every suite exhausted (or at `most`), or the
    next round, at `elapsed` seconds for `decoded` samples so far, predicted to end past
    `seconds` (AUTO_SECONDS unless given)."""
    most = AUTO_MAX if most is None else most
    seconds = AUTO_SECONDS if seconds is None else seconds
    goal = min(2 * current, most)
    new = sum(min(goal, size) - min(current, size) for size in sizes)
    if goal <= current or new <= 0:
        return None
    if decoded and elapsed + elapsed / decoded * new > seconds:
        return None
    return goal


def run_growing(session: Session, suites: list[Suite], thetas: Sequence[float], measure: str, limit: float,
                allow_execution: bool, strict_sandbox: bool, start: Callable[[int, int], Callable[[int], None]],
                seed: int = 0, clock: Callable[[], float] = time.monotonic) -> ModeRun:
    """`--limit auto`: DEFAULT_LIMIT samples a suite, then twice as many while the decision is
    unclear and the budget lasts (next_limit), decoding only the new samples each round.
    `start(samples a suite, decodings)` starts a round's progress and returns its advance."""
    begun = clock()
    rounds: list[tuple[list[int], ModeRun]] = []
    growth: list[dict] = []
    done, size = 0, DEFAULT_LIMIT
    while True:
        part = last_samples(suites, size, done)
        counts = [len(suite.samples) for suite in part]
        advance = start(size, sum(counts) * (len(thetas) + 1))
        rounds.append((counts, run_mode(session, part, thetas, measure, allow_execution, strict_sandbox, advance)))
        run = merge(rounds)
        table = assess(run.reference, run.runs, limit, seed)
        taus = {theta: summarise(records, range(len(records)))["tau"] for theta, records in run.runs.items()}
        decision = decide(table, taus)
        growth.append({"samples_per_suite": per_suite(run.reference), "clear": decision.clear,
                       "chosen": decision.chosen})
        done = size
        following = None if decision.clear else next_limit(size, [len(s.samples) for s in suites], clock() - begun,
                                                            len(run.reference))
        if following is None:
            run.growth = growth
            return run
        size = following


def _method(key: float | str) -> str:
    """A run's method name as `mars eval --sweep` names it (strict, mars@0.9)."""
    return key if isinstance(key, str) else f"mars@{key:g}"


def sweep_block(run: ModeRun, limit: float, measure: str, seed: int) -> dict:
    """The evidence stored in the profile: strict's figures, one row per theta (tau, relaxed
    share, each quality metric with its drop, the drop's 95% paired interval, its spread and
    decision, and the theta's decision), the chosen theta, whether the decision is clear, and
    the samples a suite a clear decision needs at the chosen theta and where the walk stopped."""
    everything = range(len(run.reference))
    strict = summarise(run.reference, everything)
    table = assess(run.reference, run.runs, limit, seed)
    summaries = {theta: summarise(records, everything) for theta, records in run.runs.items()}
    taus = {theta: summary["tau"] for theta, summary in summaries.items()}
    decision = decide(table, taus)
    rows = []
    for theta in sorted(run.runs):
        summary = summaries[theta]
        rows.append({
            "theta": theta,
            "tau": _round(summary["tau"]),
            "relaxed_share": _round(summary["relaxed_share"]),
            "decision": theta_decision(table[theta]),
            "metrics": {name: {"value": _round(summary[name]), "drop": _round(drop.estimate),
                               "drop_interval_95": [_round(drop.low), _round(drop.high)],
                               "paired_sd": _round(drop.sd) if math.isfinite(drop.sd) else None,
                               "decision": drop.decision}
                        for name, drop in table[theta].items() if name in summary},
        })
    suites = len({record["metric"] for record in run.reference}) or 1
    needed = []
    for theta in (decision.chosen, decision.stopped):
        if theta is not None:
            outcome, samples = theta_power(table[theta], limit, suites)
            needed.append({"theta": theta, "outcome": outcome, "samples": samples})
    block = {
        "measure": measure,
        "samples": len(run.reference),
        "samples_per_suite": per_suite(run.reference),
        "level": LEVEL,
        "strict": {name: _round(value) for name, value in strict.items()},
        "rows": rows,
        "chosen": decision.chosen,
        "decision": "clear" if decision.clear else "unclear",
        "chosen_if_unclear_passed": decision.if_unclear_passed,
        "samples_needed": needed,
    }
    if run.growth is not None:
        block["growth"] = run.growth
    return block


def _round(value: float) -> float:
    return round(value, 6) if math.isfinite(value) else value
