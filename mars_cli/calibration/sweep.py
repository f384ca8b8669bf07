"""The measured-quality objective (`mars calibrate --objective quality=DROP`): sweep theta over a
suite with task metrics and keep the most permissive theta whose quality is clearly within DROP
(no more permissive than the speed it buys).

The loss objective is a bound on what relaxation could cost; this one measures it. Per decoding
mode the target decodes every sample once with strict verification (the reference, whose emitted
positions also feed the loss bound reported beside the fit) and once per theta with MARS, on one
loaded target and one drafter (only the verifier changes between runs, passed to each decoding
call). Each run's per-sample records are `mars eval`'s, and eval's aggregation gives tau, the
relaxed share, the target's mean log-probability and each suite's task metric.

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
from collections import defaultdict
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

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
SPEED_TIE = 0.01  # a tau within 1% of the best passing one counts as the same speed
LEVEL = 0.95  # each drop's interval; a clear decision is one at this level
RESAMPLES = 2000  # bootstrap draws per interval
Z = 1.959963984540054  # the normal quantile of a two-sided 95% interval (the power estimate)
AUTO = "auto"
AUTO_MAX = 32  # --limit auto: at most this many samples a suite
AUTO_SECONDS = 1200.0  # --limit auto: no round that would end past this much sweeping of one mode
PASS, FAIL, UNCLEAR = "pass", "fail", "unclear"


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


# --------------------------------------------------------------------------- the statistics
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
