"""The measured-quality objective (`mars calibrate --objective quality=DROP`): sweep theta over a
suite with task metrics and keep the most permissive theta whose quality stays within DROP
(no more permissive than the speed it buys).

The loss objective is a bound on what relaxation could cost; this one measures it. Per decoding
mode the target decodes every sample once with strict verification (the reference, whose emitted
positions also feed the loss bound reported beside the fit) and once per theta with MARS, on one
loaded target and one drafter (only the verifier changes between runs, passed to each decoding
call). Each run's per-sample records are `mars eval`'s, and eval's aggregation gives tau, the
relaxed share, the target's mean log-probability and each suite's task metric; a theta passes
when every quality metric's relative drop from strict is at most DROP. Walking from the
strictest theta down, the passing ones are those before the first failure, so a noisy pass below
a failure is never picked; of them the chosen one is the strictest whose tau is within 1% of the
best passing tau, since relaxing further for no speed only spends the quality budget. A bootstrap
over samples (within each suite) gives the chosen theta's interval and each drop's interval.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ..errors import UserError, require
from .collection import TopTwoRecorder

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
SPEED = ("tau", "relaxed_share")  # the other keys of a summary are quality metrics
RESAMPLES = 200
SPEED_TIE = 0.01  # a tau within 1% of the best passing one counts as the same speed


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


def quality_suites(spec: str, limit: int, allow_code_execution: bool) -> list[Suite]:
    """The suites to sweep over, each cut to its last `limit` samples. A suite whose task metric
    cannot be measured here is refused, naming the ones that can."""
    from ..evaluation.suites import BUILTIN, load_suite

    require(limit >= 1, f"--limit must be at least 1, got {limit}")
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
        suite.samples = suite.samples[-limit:]
        suites.append(suite)
    return suites


# --------------------------------------------------------------------------- the statistics
def summarise(records: Sequence[dict], indices: Sequence[int]) -> dict[str, float]:
    """tau, relaxed share, mean log-probability per token and each suite's mean task metric over
    the chosen records (indices may repeat: bootstrap resamples), pooled as `mars eval` pools a
    method's records."""
    from ..evaluation.aggregate import method_row

    chosen = [records[i] for i in indices]
    pooled = method_row("pooled", chosen, {})  # no vanilla run: no agreement figures
    summary = {"tau": pooled["tau"], "relaxed_share": pooled["relaxed_share"], "mean_logprob": pooled["mean_logprob"]}
    scored: dict[str, list[dict]] = defaultdict(list)  # a sample without a score does not count
    for record in chosen:
        if record["task_score"] is not None:
            scored[record["metric"]].append(record)
    summary.update({name: method_row(name, group, {})["task_metric"] for name, group in scored.items()})
    return summary


def relative_drop(reference: float, value: float) -> float:
    """How much worse than strict, as a share of strict's magnitude (higher is better for every
    metric, the log-probability included); a reference of 0 can only be matched or beaten."""
    if abs(reference) < 1e-12:
        return 0.0 if value >= reference else math.inf
    return (reference - value) / abs(reference)


def drops(reference: Mapping[str, float], summary: Mapping[str, float]) -> dict[str, float]:
    return {name: relative_drop(value, summary[name]) for name, value in reference.items()
            if name not in SPEED and name in summary}


def select(table: Mapping[float, Mapping[str, float]], limit: float,
           taus: Mapping[float, float] | None = None) -> float | None:
    """The theta to ship: walking from the strictest theta down, the ones before the first whose
    drop exceeds limit pass; of those, the strictest whose tau (when given) is within SPEED_TIE of
    the best passing tau, else the most permissive. None when even the strictest one fails."""
    passing = []
    for theta in sorted(table, reverse=True):
        if any(drop > limit for drop in table[theta].values()):
            break
        passing.append(theta)
    if not passing:
        return None
    if taus is None:
        return passing[-1]
    best = max(taus[theta] for theta in passing)
    return next(theta for theta in passing if taus[theta] >= best * (1 - SPEED_TIE))


def drop_table(reference: Sequence[dict], runs: Mapping[float, Sequence[dict]],
               indices: Sequence[int]) -> tuple[dict[float, dict[str, float]], dict[float, float]]:
    """Each theta's quality drops from strict, and its tau, over the chosen samples."""
    strict = summarise(reference, indices)
    summaries = {theta: summarise(records, indices) for theta, records in runs.items()}
    return ({theta: drops(strict, summary) for theta, summary in summaries.items()},
            {theta: summary["tau"] for theta, summary in summaries.items()})


def bootstrap(reference: Sequence[dict], runs: Mapping[float, Sequence[dict]], limit: float,
              resamples: int = RESAMPLES, seed: int = 0) -> tuple[list[float], dict[float, dict[str, list[float]]]]:
    """5%-95% intervals from resampling samples within each suite: of the chosen theta (strict,
    1.0, when none passes) and of every theta's drops."""
    rng = random.Random(seed)
    by_suite: dict[str, list[int]] = defaultdict(list)
    for index, record in enumerate(reference):
        by_suite[record["metric"]].append(index)
    chosen, spread = [], defaultdict(list)
    for _ in range(resamples):
        indices = [rng.choice(group) for group in by_suite.values() for _ in group]
        table, taus = drop_table(reference, runs, indices)
        picked = select(table, limit, taus)
        chosen.append(1.0 if picked is None else picked)
        for theta, row in table.items():
            for name, value in row.items():
                spread[(theta, name)].append(value)
    intervals: dict[float, dict[str, list[float]]] = defaultdict(dict)
    for (theta, name), values in spread.items():
        intervals[theta][name] = percentile_interval(values)
    return percentile_interval(chosen), dict(intervals)


def percentile_interval(values: list[float]) -> list[float]:
    """The 5th and 95th percentiles of `values` (a bootstrap's 90% interval)."""
    ordered = sorted(values)
    return [ordered[int(0.05 * (len(ordered) - 1))], ordered[int(0.95 * (len(ordered) - 1))]]


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
    positions (the positions this mode visits)."""

    reference: list[dict]
    runs: dict[float, list[dict]]
    z1: list[list[float]]
    z2: list[list[float]]


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


def _method(key: float | str) -> str:
    """A run's method name as `mars eval --sweep` names it (strict, mars@0.9)."""
    return key if isinstance(key, str) else f"mars@{key:g}"


def sweep_block(run: ModeRun, limit: float, measure: str, seed: int) -> dict:
    """The evidence stored in the profile: strict's figures, one row per theta (tau, relaxed
    share, each quality metric with its drop and the drop's interval), the chosen theta and its
    interval. Thetas are as applied at the mode's temperature."""
    everything = range(len(run.reference))
    strict = summarise(run.reference, everything)
    interval, drop_intervals = bootstrap(run.reference, run.runs, limit, seed=seed)
    rows = []
    for theta in sorted(run.runs):
        summary = summarise(run.runs[theta], everything)
        row_drops = drops(strict, summary)
        rows.append({
            "theta": theta,
            "tau": _round(summary["tau"]),
            "relaxed_share": _round(summary["relaxed_share"]),
            "metrics": {name: {"value": _round(summary[name]), "drop": _round(drop),
                               "drop_interval_90": [_round(v) for v in drop_intervals[theta][name]]}
                        for name, drop in row_drops.items()},
        })
    table, taus = drop_table(run.reference, run.runs, everything)
    chosen = select(table, limit, taus)
    return {
        "measure": measure,
        "samples": len(run.reference),
        "strict": {name: _round(value) for name, value in strict.items()},
        "rows": rows,
        "chosen": chosen,
        "chosen_interval_90": [_round(v) for v in interval],
    }


def _round(value: float) -> float:
    return round(value, 6) if math.isfinite(value) else value
