"""`mars eval --baseline`: a stored run (its results.json) against this one, figure by figure.

Each suite x method x figure gets its change with a paired bootstrap interval over the samples
both runs hold, matched by (suite, sample id). A run is compared only with a baseline of the same
target, head, dtype, token budget, temperature, engine and suite contents (its `identity`), unless
--baseline-ignore names what may differ. `--max-regression tau=0.05,...` fails a figure whose
interval lies wholly below the baseline less the tolerance: relative for tau and the two speedups
(0.05: 5% of the baseline's figure), absolute for the task metric, agreement and log-probability.
Gate intervals are widened for the number of gates judged (Bonferroni), so a run's gates together
raise a false alarm at most 2.5% of the time on statistical figures; on deterministic ones
(figures.py) an unchanged run's change is exactly zero and never fails.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from ..errors import UserError, require
from .bootstrap import change, interval
from .figures import METRICS, curve_from
from .suites import Suite

IDENTITY_KEYS = ("target", "head", "dtype", "max_new_tokens", "temperature", "engine", "suites")
FAMILY_ALPHA = 0.05  # two-sided, spread over a run's gates: each gate's one-sided false alarm <= 0.025 / gates
GATE_RESAMPLES = 10000  # the gates' intervals reach far into the tails
# below this many paired samples a bootstrap interval of a statistical figure is far too narrow
# (one sample: a point), so such a gate reports and passes; deterministic figures need no minimum
MIN_STATISTICAL_SAMPLES = 8


# --------------------------------------------------------------------------- what a run is
def suite_digest(suite: Suite) -> str:
    """The suite's contents (prompts, references, stops, metric): a changed suite changes it."""
    content = [[s.id, s.turns, s.reference, s.raw, list(s.stop)] for s in suite.samples]
    text = json.dumps({"metric": suite.metric, "samples": content}, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def module_digest(module) -> str:
    """Every weight of a torch module (a draft head): noise added to any of them changes it."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().float().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def identity(config: dict, suites: list[Suite], target: str, head: str | None) -> dict:
    """What must match for two runs' figures to be comparable (IDENTITY_KEYS)."""
    return {"target": target, "head": head, "dtype": config.get("dtype"),
            "max_new_tokens": config.get("max_new_tokens"), "temperature": config.get("temperature"),
            "engine": str(config.get("engine", "transformers")).split(" ")[0],
            "suites": {s.name: suite_digest(s) for s in suites}}


# --------------------------------------------------------------------------- flags
def parse_regressions(text: str | None) -> dict[str, float]:
    """`tau=0.05,task=0.02,...` -> {figure: tolerance}; one line naming the figures otherwise."""
    if not text:
        return {}
    limits: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        require(name in METRICS and math.isfinite(number) and number >= 0,
                f"--max-regression {part!r}: expected FIGURE=TOLERANCE (a number >= 0), FIGURE one of "
                f"{', '.join(METRICS)}")
        limits[name] = number
    return limits


def parse_ignore(text: str | None) -> set[str]:
    keys = {p.strip() for p in (text or "").split(",") if p.strip()}
    unknown = sorted(keys - set(IDENTITY_KEYS))
    require(not unknown, f"--baseline-ignore {','.join(unknown)}: expected some of {', '.join(IDENTITY_KEYS)}")
    return keys


# --------------------------------------------------------------------------- the stored run
def baseline_file(path: Path) -> Path:
    """--baseline's file: a run directory's results.json, or the file named."""
    return path / "results.json" if path.is_dir() else path


def load(path: Path) -> dict:
    """A baseline: a run directory (its results.json) or the results.json itself, checked for
    what a comparison reads."""
    from ..inputs import LOG_LIMIT, read_text

    file = baseline_file(path)
    require(file.exists(), f"--baseline {path}: no such run (expected a run directory or its results.json)")
    try:
        document = json.loads(read_text(file, "baseline", LOG_LIMIT))
    except (ValueError, RecursionError):
        raise UserError(f"--baseline {file} is not valid JSON (truncated?); save the baseline again") from None
    require(isinstance(document, dict) and isinstance(document.get("identity"), dict)
            and isinstance(document.get("samples"), list),
            f"--baseline {file} has no identity or per-sample figures: save it again with this mars "
            "(mars eval --save-baseline DIR)")
    require(document.get("complete", False), f"--baseline {file} is an interrupted run; finish it with --resume first")
    for record in document["samples"]:
        require(isinstance(record, dict) and all(k in record for k in ("suite", "sample_id", "method", "new_tokens",
                                                                        "rounds", "wall_s", "sum_logprob")),
                f"--baseline {file}: a per-sample record is malformed; save the baseline again")
    return document


def check_comparable(current: dict, baseline: dict, ignore: set[str], where: Path) -> None:
    """Refuse, in one line, a baseline whose identity differs in what is not ignored."""
    stored = baseline["identity"]
    for key in IDENTITY_KEYS:
        if key in ignore or current.get(key) == stored.get(key):
            continue
        if key == "suites":
            ours, theirs = current["suites"], stored.get("suites") or {}
            changed = sorted(set(ours) ^ set(theirs)) or sorted(n for n in ours if ours[n] != theirs.get(n))
            detail = f"suites {', '.join(changed)} differ (this run: {', '.join(ours)}; baseline: {', '.join(theirs)})"
        else:
            detail = f"{key} differs (baseline {stored.get(key)!r}, this run {current.get(key)!r})"
        raise UserError(f"--baseline {where}: {detail}; compare like with like, or pass --baseline-ignore {key}")


def check_samples(current: list[dict], baseline: list[dict], where: Path) -> None:
    """Every sample this run holds for a method the baseline ran must be in the baseline."""
    stored = {(r["suite"], r["sample_id"], r["method"]) for r in baseline}
    methods = {r["method"] for r in baseline}
    for record in current:
        key = (record["suite"], record["sample_id"], record["method"])
        require(record["method"] not in methods or key in stored,
                f"--baseline {where} has no {record['method']} record of {record['suite']}/{record['sample_id']} "
                "(a truncated or smaller run); compare runs of the same samples")


# --------------------------------------------------------------------------- comparing
def compare(current: list[dict], baseline: dict, scopes: list[str], level: float = 0.95,
            resamples: int = 2000, names: set[str] | None = None) -> list[dict]:
    """One entry per scope x method (both runs') x figure both have (of `names`, if given): the
    two figures and the change with its paired interval. Both runs are priced by the baseline's
    cost curve."""
    curve = curve_from((baseline.get("cost_curve") or {}).get("ms_by_width"))
    stored = baseline["samples"]
    methods = [m for m in dict.fromkeys(r["method"] for r in current) if any(r["method"] == m for r in stored)]
    comparisons = []
    for scope in scopes:
        for method in methods:
            for metric in METRICS.values():
                if names is not None and metric.name not in names:
                    continue
                if method == "vanilla" and not metric.of_vanilla:
                    continue
                entry = _compare_one(metric, current, stored, scope, method, curve, level, resamples)
                if entry is not None:
                    comparisons.append(entry)
    return comparisons


def _compare_one(metric, current, stored, scope, method, curve, level, resamples) -> dict | None:
    def by_sample(records):
        chosen = [r for r in records if scope == "all" or r["suite"] == scope]
        vanilla = {(r["suite"], r["sample_id"]): r for r in chosen if r["method"] == "vanilla"}
        return {(r["suite"], r["sample_id"]): metric.columns(r, vanilla.get((r["suite"], r["sample_id"])), curve)
                for r in chosen if r["method"] == method}

    ours, theirs = by_sample(current), by_sample(stored)
    rows = [[*ours[key], *theirs[key]] for key in ours if ours[key] is not None and theirs.get(key) is not None]
    if not rows:
        return None
    columns = np.array(rows, dtype=np.float64)
    found = interval(columns, change(metric.shifted(0), metric.shifted(metric.width), metric.relative),
                     resamples=resamples, level=level)
    current_figure = float(metric.shifted(0)(columns.sum(axis=0)[None])[0])
    baseline_figure = float(metric.shifted(metric.width)(columns.sum(axis=0)[None])[0])
    return {"scope": scope, "method": method, "metric": metric.name, "label": metric.label,
            "relative": metric.relative, "deterministic": metric.deterministic,
            "baseline": baseline_figure, "current": current_figure, "change": found.estimate,
            "low": found.low, "high": found.high, "samples": found.samples, "level": level}


def gate_level(gates: int) -> float:
    """Each gate's two-sided interval level when `gates` are judged (Bonferroni)."""
    return 1.0 - FAMILY_ALPHA / max(1, gates)


def regression_gates(current: list[dict], baseline: dict, scopes: list[str], limits: dict[str, float],
                     deterministic: bool = False) -> list[dict]:
    """One outcome per scope x method x limited figure: failed when the change's interval (at
    gate_level) lies wholly below -tolerance. Figures neither run has (no task metric) are left out.
    `deterministic`: both runs decoded deterministically (greedy, float32, fixed shapes), so their
    token-derived figures are exact; any other figure is statistical and judged only on at least
    MIN_STATISTICAL_SAMPLES samples."""
    if not limits:
        return []
    methods = {r["method"] for r in current} & {r["method"] for r in baseline["samples"]}
    count = sum(1 for method in methods for name in limits if method != "vanilla" or METRICS[name].of_vanilla)
    count *= len(scopes)
    entries = compare(current, baseline, scopes, level=gate_level(count), resamples=GATE_RESAMPLES, names=set(limits))
    outcomes = []
    for entry in entries:
        if entry["metric"] not in limits:
            continue
        tolerance = limits[entry["metric"]]
        exact = deterministic and entry["deterministic"]
        too_few = not exact and entry["samples"] < MIN_STATISTICAL_SAMPLES
        failed = entry["high"] < -tolerance and not too_few
        unit = "%" if entry["relative"] else ""
        scale = 100.0 if entry["relative"] else 1.0
        figure = (f"{entry['label']} changed {entry['change'] * scale:+.2f}{unit} "
                  f"[{entry['low'] * scale:+.2f}{unit}, {entry['high'] * scale:+.2f}{unit}] "
                  f"against the baseline ({entry['baseline']:.4g} -> {entry['current']:.4g}, "
                  f"{entry['samples']} samples)")
        verdict = (f"wholly below -{tolerance * scale:g}{unit}" if failed
                   else f"not judged: a statistical figure needs {MIN_STATISTICAL_SAMPLES} samples" if too_few
                   else f"within -{tolerance * scale:g}{unit}")
        outcomes.append({"scope": entry["scope"], "method": entry["method"], "gate": f"regression:{entry['metric']}",
                         "passed": not failed,
                         "message": f"{entry['scope']}/{entry['method']}: {figure}: {verdict}"})
    return outcomes
