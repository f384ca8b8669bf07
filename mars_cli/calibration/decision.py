"""The statistics of the quality= decision: each theta's paired drops from strict, their
intervals and decisions, the walk that chooses a theta, and the power estimate of the samples a
clear decision needs.

Separate from sweep.py, which runs the sweep, because these are pure functions over the
per-sample records a sweep produces (`mars eval`'s records: suite, sample_id, metric,
task_score, sum_logprob, new_tokens, ...): no session, no model, no torch, so the rule can be
read, tested and reused (benchmarks/tools/paired_tau.py) on stored records alone.

The decision, per theta and quality metric. A metric's drop is its relative change from strict,
`(strict - mars) / |strict|`, over the samples both runs decoded (strict and MARS at a theta
decode the same samples, so the comparison is paired, as `mars eval --baseline` pairs two runs):
each suite's task metric over that suite's samples, the mean log-probability over all of them. Its
95% interval is evaluation/bootstrap.py's paired percentile bootstrap (2000 resamples of the
samples, the generator seeded with bootstrap.SEED plus --seed, so the same records give the same
decision on any machine). A metric is
  - a clear pass when the interval's upper end is <= DROP (the drop is within DROP),
  - a clear fail when its lower end is > DROP (the drop is beyond DROP),
  - unclear otherwise (the interval straddles DROP: more samples would decide it).
A theta passes when every metric is a clear pass, fails when any is a clear fail, and is unclear
otherwise. Walking from the strictest theta down, the passing ones are those before the first
theta that does not pass (fails or is unclear: an unclear theta is treated as not passing, so the
walk stops there), so a noisy pass below a failure is never picked; of them the chosen one is the
strictest whose tau is within 1% of the best passing tau, since relaxing further for no speed
only spends the quality budget. The walk's decision is clear when it stopped at a clear fail or
passed every theta, unclear when it stopped at an unclear theta; the profile then also records
the choice had every unclear theta passed (`chosen_if_unclear_passed`). Each metric's interval is
at 95% on its own (no correction for the several metrics and thetas judged): a clear pass needs
every metric within, a clear fail one metric beyond.

The power estimate (`samples_needed`): from each drop's observed per-sample spread, how many
samples a suite would make the decision at the chosen theta, and at the theta the walk stopped at,
clear at the 95% level, i.e. the interval's half-width smaller than the distance |DROP - drop| of
the observed drop from DROP. The spread is the sample standard deviation `sd` of the per-sample
paired differences, linearised (each sample's influence on the drop by the delta method; for a
task metric scored once a sample and a drop near 0 that is `(strict_i - mars_i) / |strict|`),
and a normal approximation gives n = (1.96 * sd / |DROP - drop|) ** 2, rounded up, at least 2.
A suite's task metric rests on that suite's samples; the pooled log-probability on all suites'
samples, so its n is divided by the number of suites. A theta whose point drops are all within
DROP needs the largest n of its metrics (every one must be clearly within); one whose point drop
of some metric is beyond DROP needs the smallest n among those metrics (one clearly beyond is
enough). A drop of exactly DROP, or a metric on one sample, has no estimate (None).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import require

SPEED = ("tau", "relaxed_share")  # the other keys of a summary are quality metrics
SPEED_TIE = 0.01  # a tau within 1% of the best passing one counts as the same speed
LEVEL = 0.95  # each drop's interval; a clear decision is one at this level
RESAMPLES = 2000  # bootstrap draws per interval
Z = 1.959963984540054  # the normal quantile of a two-sided 95% interval (the power estimate)
PASS, FAIL, UNCLEAR = "pass", "fail", "unclear"


def summarise(records: Sequence[dict], indices: Sequence[int]) -> dict[str, float]:
    """tau, relaxed share, mean log-probability per token and each suite's mean task metric over
    the chosen records, pooled as `mars eval` pools a method's records."""
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


def paired_drop(sums: np.ndarray) -> np.ndarray:
    """The relative drop over paired columns (mars numerator, denominator, strict numerator,
    denominator) from their sums [..., 4], as relative_drop computes it (a figure over no tokens
    is 0, as `mars eval` reports it)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        mars = np.where(sums[..., 1] == 0, 0.0, sums[..., 0] / sums[..., 1])
        strict = np.where(sums[..., 3] == 0, 0.0, sums[..., 2] / sums[..., 3])
        relative = (strict - mars) / np.abs(strict)
    return np.where(np.abs(strict) < 1e-12, np.where(mars >= strict, 0.0, np.inf), relative)


def paired_columns(reference: Sequence[dict], records: Sequence[dict], name: str) -> np.ndarray:
    """One row per sample both runs decoded (records[i] is reference[i]'s sample at a theta):
    [mars numerator, denominator, strict numerator, denominator] of metric `name`, the pooled
    mean log-probability (log-probability, tokens) or a suite's task metric (score, 1) over that
    suite's scored samples."""
    rows = []
    for strict, mars in zip(reference, records, strict=True):
        require(strict["suite"] == mars["suite"] and strict["sample_id"] == mars["sample_id"],
                f"internal: the sweep's runs of {strict['suite']}/{strict['sample_id']} are out of step")
        if name == "mean_logprob":
            rows.append((mars["sum_logprob"], mars["new_tokens"], strict["sum_logprob"], strict["new_tokens"]))
        elif strict["metric"] == name and strict["task_score"] is not None and mars["task_score"] is not None:
            rows.append((mars["task_score"], 1.0, strict["task_score"], 1.0))
    return np.array(rows, dtype=np.float64).reshape(-1, 4)


def paired_sd(columns: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray] = paired_drop) -> float:
    """The sample standard deviation of each sample's influence on `statistic` (a figure of the
    columns' sums that does not change when every sum scales, as a ratio does): the delta method's
    linearised paired difference, whose spread over sqrt(n) is the figure's standard error. NaN
    with fewer than two samples or where the figure is undefined."""
    columns = np.asarray(columns, dtype=np.float64)
    count = columns.shape[0]
    if count < 2:
        return math.nan
    sums = columns.sum(axis=0)
    gradient = np.empty(columns.shape[1])
    for j in range(columns.shape[1]):
        step = 1e-6 * max(1.0, abs(sums[j]))
        up, down = sums.copy(), sums.copy()
        up[j] += step
        down[j] -= step
        gradient[j] = (float(statistic(up[None])[0]) - float(statistic(down[None])[0])) / (2 * step)
    if not np.all(np.isfinite(gradient)):
        return math.nan
    influence = count * ((columns - columns.mean(axis=0)) @ gradient)
    return float(influence.std(ddof=1))


def samples_needed(sd: float, margin: float, z: float = Z) -> int | None:
    """Samples that make a drop whose per-sample paired differences spread by `sd` clearly
    decided, `margin` from the line (the normal approximation n = (z * sd / margin) ** 2, rounded
    up, at least 2); None for a drop on the line itself or no spread estimate."""
    if not math.isfinite(sd) or not math.isfinite(margin) or margin <= 0:
        return None
    return max(2, math.ceil((z * sd / margin) ** 2))


@dataclasses.dataclass(frozen=True)
class Drop:
    """One metric's drop at one theta: the estimate, its 95% paired interval, the per-sample
    spread, the samples it rests on and the decision (PASS, FAIL or UNCLEAR)."""

    estimate: float
    low: float
    high: float
    sd: float
    samples: int
    decision: str


def judge(low: float, high: float, limit: float) -> str:
    """A drop's decision from its interval: clearly within `limit`, clearly beyond, or unclear."""
    if high <= limit:
        return PASS
    if low > limit:
        return FAIL
    return UNCLEAR


def theta_decision(row: Mapping[str, Drop]) -> str:
    """A theta fails when any metric clearly fails, passes when every one clearly passes."""
    decisions = {drop.decision for drop in row.values()}
    return FAIL if FAIL in decisions else UNCLEAR if UNCLEAR in decisions else PASS


def assess(reference: Sequence[dict], runs: Mapping[float, Sequence[dict]], limit: float,
           seed: int = 0) -> dict[float, dict[str, Drop]]:
    """Every theta's drops from strict, each with its paired interval and decision."""
    from ..evaluation.bootstrap import SEED, interval

    names = ["mean_logprob", *dict.fromkeys(r["metric"] for r in reference if r["task_score"] is not None)]
    table: dict[float, dict[str, Drop]] = {}
    for theta, records in runs.items():
        row = {}
        for name in names:
            columns = paired_columns(reference, records, name)
            if not len(columns):
                continue
            found = interval(columns, paired_drop, resamples=RESAMPLES, seed=(SEED + seed) % 2**64, level=LEVEL)
            row[name] = Drop(found.estimate, found.low, found.high, paired_sd(columns), found.samples,
                             judge(found.low, found.high, limit))
        table[theta] = row
    return table


def walk(decisions: Mapping[float, str],
         taus: Mapping[float, float] | None = None) -> tuple[float | None, float | None]:
    """(the theta to ship, the theta the walk stopped at): walking from the strictest theta down,
    the ones before the first that does not pass are passing; of those, the strictest whose tau
    (when given) is within SPEED_TIE of the best passing tau, else the most permissive. The
    choice is None when even the strictest does not pass; the stop None when every theta passes."""
    passing, stopped = [], None
    for theta in sorted(decisions, reverse=True):
        if decisions[theta] != PASS:
            stopped = theta
            break
        passing.append(theta)
    if not passing:
        return None, stopped
    if taus is None:
        return passing[-1], stopped
    best = max(taus[theta] for theta in passing)
    return next(theta for theta in passing if taus[theta] >= best * (1 - SPEED_TIE)), stopped


def select(table: Mapping[float, Mapping[str, float]], limit: float,
           taus: Mapping[float, float] | None = None) -> float | None:
    """The walk on point drops alone (a theta passes when no drop exceeds limit)."""
    decisions = {theta: FAIL if any(drop > limit for drop in row.values()) else PASS for theta, row in table.items()}
    return walk(decisions, taus)[0]


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the walk over the assessed thetas decided."""

    chosen: float | None
    stopped: float | None  # the first theta that did not pass (None: all did)
    clear: bool  # False when the walk stopped at an unclear theta
    if_unclear_passed: float | None  # the choice had every unclear theta passed


def decide(table: Mapping[float, Mapping[str, Drop]], taus: Mapping[float, float]) -> Decision:
    decisions = {theta: theta_decision(row) for theta, row in table.items()}
    chosen, stopped = walk(decisions, taus)
    hopeful = walk({theta: PASS if d == UNCLEAR else d for theta, d in decisions.items()}, taus)[0]
    return Decision(chosen, stopped, stopped is None or decisions[stopped] != UNCLEAR, hopeful)


def theta_power(row: Mapping[str, Drop], limit: float, suites: int) -> tuple[str, int | None]:
    """(the outcome the point drops point to, the samples a suite that would make it clear):
    a pass needs every metric clearly within (the largest n), a fail one clearly beyond (the
    smallest n among the metrics beyond). The pooled log-probability's n is shared by the suites."""
    def needed(name: str, drop: Drop) -> float:
        n = samples_needed(drop.sd, abs(limit - drop.estimate))
        if n is None:
            return math.inf
        return math.ceil(n / suites) if name == "mean_logprob" else n

    beyond = {name: drop for name, drop in row.items() if drop.estimate > limit}
    if beyond:
        outcome, value = FAIL, min(needed(name, drop) for name, drop in beyond.items())
    else:
        outcome, value = PASS, max((needed(name, drop) for name, drop in row.items()), default=2)
    return outcome, (None if math.isinf(value) else max(2, int(value)))


def per_suite(reference: Sequence[dict]) -> int:
    """The most samples any suite contributed."""
    counts: dict[str, int] = defaultdict(int)
    for record in reference:
        counts[record["metric"]] += 1
    return max(counts.values(), default=0)


def percentile_interval(values: list[float]) -> list[float]:
    """The 5th and 95th percentiles of `values` (a bootstrap's 90% interval)."""
    ordered = sorted(values)
    return [ordered[int(0.05 * (len(ordered) - 1))], ordered[int(0.95 * (len(ordered) - 1))]]
