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
    """`tau=0.05,task=0.02,...` -> {figure: tolerance}; one line naming the figures otherwise (a
    flag that names no figure, or one figure twice, sets no gate silently no more)."""
    if text is None:
        return {}
    expected = f"expected FIGURE=TOLERANCE (a number >= 0), FIGURE one of {', '.join(METRICS)}"
    limits: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        require(name in METRICS and math.isfinite(number) and number >= 0, f"--max-regression {part!r}: {expected}")
        require(name not in limits, f"--max-regression {text!r} names {name} twice: give each figure once")
        limits[name] = number
    require(bool(limits), f"--max-regression {text!r} names no figure: {expected}")
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
    """A baseline: a run directory (its results.json) or the results.json itself, validated as a
    whole against the results schema (`validate`, which the writer applies too) when it is read:
    a forged or damaged file is one line before any model loads, never a crash or a silent pass
    after the run."""
    from ..inputs import LOG_LIMIT, read_text

    file = baseline_file(path)
    require(file.exists(), f"--baseline {path}: no such run (expected a run directory or its results.json)")
    text = read_text(file, "baseline", LOG_LIMIT)
    try:
        document = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant,
                              parse_float=_finite_float)
    except _Refused as exc:
        raise UserError(f"--baseline {file}: {exc}; save the baseline again") from None
    except (ValueError, RecursionError):
        raise UserError(f"--baseline {file} is not valid JSON (truncated?); save the baseline again") from None
    require(isinstance(document, dict) and isinstance(document.get("identity"), dict)
            and isinstance(document.get("samples"), list),
            f"--baseline {file} has no identity or per-sample figures: save it again with this mars "
            "(mars eval --save-baseline DIR)")
    require(document.get("complete", False) is True,
            f"--baseline {file} is an interrupted run; finish it with --resume first")
    problem = schema_problem(document)
    if problem is not None:
        raise UserError(f"--baseline {file}: {problem}; save the baseline again")
    return document


# --------------------------------------------------------------------------- the schema
# A results document as a baseline reads it: the writer (ci.save_baseline) checks what it writes
# against the same rules. Every number finite; counts bounded (a 4,000-digit count crashed the
# bootstrap); ids text; every per-sample record once.
MAX_COUNT = 10**9  # tokens, rounds, forwards of one sample
MAX_WIDTH = 4096  # positions of one forward


class _Refused(ValueError):
    """A JSON text the parser itself refuses beyond syntax: duplicated keys, NaN, overflowing numbers."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise _Refused(f"the key {_short(key)} appears twice in one object (which one holds?)")
        seen[key] = value
    return seen


def _no_constant(name: str) -> float:
    raise _Refused(f"{name} is not a number a run records (every figure is finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{text[:20]} overflows a float (every figure is finite)")
    return value


def _short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str) if not isinstance(value, int) or abs(value) < 10**30 \
        else f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= 40 else text[:37] + "..."


def _is_count(value: object, low: int = 0, high: int = MAX_COUNT) -> bool:
    return type(value) is int and low <= value <= high


def _is_number(value: object, low: float = -math.inf, high: float = math.inf) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e300
            and math.isfinite(value) and low <= value <= high)


def _is_text(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _width_key(key: object) -> bool:
    return isinstance(key, str) and key.isascii() and key.isdigit() and 1 <= int(key) <= MAX_WIDTH


IDENTITY_TYPES = {  # key -> (check, what it must be)
    "target": (lambda v: v is None or isinstance(v, str), "text or null"),
    "head": (lambda v: v is None or isinstance(v, str), "text or null"),
    "dtype": (lambda v: v is None or isinstance(v, str), "text or null"),
    "max_new_tokens": (lambda v: v is None or _is_count(v, 1), "a positive integer or null"),
    "temperature": (lambda v: v is None or _is_number(v, 0.0), "a finite number >= 0 or null"),
    "engine": (lambda v: v is None or isinstance(v, str), "text or null"),
    "suites": (lambda v: isinstance(v, dict) and bool(v) and all(_is_text(k) and isinstance(d, str) for k, d in v.items()),
               "an object of suite name -> digest"),
}
RECORD_TYPES = {  # field -> (required, check, what it must be)
    "suite": (True, _is_text, "a suite name"),
    "sample_id": (True, _is_text, "a sample id (text)"),
    "method": (True, _is_text, "a method name"),
    "new_tokens": (True, _is_count, f"an integer from 0 to {MAX_COUNT}"),
    "rounds": (True, _is_count, f"an integer from 0 to {MAX_COUNT}"),
    "wall_s": (True, lambda v: _is_number(v, 0.0), "a finite number of seconds >= 0"),
    "sum_logprob": (True, _is_number, "a finite number"),
    "walls": (False, lambda v: isinstance(v, list) and all(_is_number(w, 0.0) for w in v),
              "a list of finite numbers of seconds >= 0"),
    "widths": (False, lambda v: isinstance(v, dict) and all(_width_key(k) and _is_count(n) for k, n in v.items()),
               f"an object of width (1 to {MAX_WIDTH}) -> forwards"),
    "task_score": (False, lambda v: v is None or _is_number(v), "a finite number or null"),
    "agreement_tokens": (False, lambda v: v is None or _is_number(v, 0.0, 1.0), "a number from 0 to 1 or null"),
    "agreement_rouge_l": (False, lambda v: v is None or _is_number(v, 0.0, 1.0), "a number from 0 to 1 or null"),
}


def schema_problem(document: dict) -> str | None:
    """What makes `document` (a results document) unusable as a baseline, in one clause; None
    when it validates: an identity of the right types, a non-empty list of per-sample records,
    each once, of the right types and finite, their suites those of the identity, a cost curve
    of positive widths and finite positive milliseconds, a determinism record."""
    records = document.get("samples")
    if not isinstance(records, list) or not records:
        return "samples holds no per-sample records (an empty run gates nothing)"
    seen: set[tuple[str, str, str]] = set()
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            return f"a per-sample record is malformed (samples[{index}] is not an object)"
        for field, (required, check, what) in RECORD_TYPES.items():
            if field not in record:
                if required:
                    return f"a per-sample record is malformed (samples[{index}] has no {field})"
                continue
            if not check(record[field]):
                return f"a per-sample record is malformed (samples[{index}].{field} must be {what}, got " \
                       f"{_short(record[field])})"
        if record["new_tokens"] and not record["rounds"]:
            return f"a per-sample record is malformed (samples[{index}]: {record['new_tokens']} tokens in 0 rounds)"
        key = (record["suite"], record["sample_id"], record["method"])
        if key in seen:
            return f"samples holds {key[2]}'s record of {key[0]}/{key[1]} twice"
        seen.add(key)
    identity = document.get("identity")
    if not isinstance(identity, dict):
        return "identity must be an object"
    for key, (check, what) in IDENTITY_TYPES.items():
        if key not in identity:
            return f"identity has no {key}"
        if not check(identity[key]):
            return f"identity.{key} must be {what}, got {_short(identity[key])}"
    stray = next((r["suite"] for r in records if r["suite"] not in identity["suites"]), None)
    if stray is not None:
        return f"samples hold records of the suite {_short(stray)}, which identity.suites does not list"
    curve = document.get("cost_curve")
    if curve is not None:
        widths = curve.get("ms_by_width") if isinstance(curve, dict) else None
        if not isinstance(widths, dict) or not widths:
            return "cost_curve must be null or an object with ms_by_width {width: milliseconds}"
        for width, ms in widths.items():
            if not _width_key(width) or not _is_number(ms) or ms <= 0:
                return (f"cost_curve.ms_by_width must map widths 1 to {MAX_WIDTH} to finite milliseconds > 0, "
                        f"got {_short(width)}: {_short(ms)}")
        if "source" in curve and not isinstance(curve["source"], str):
            return "cost_curve.source must be text"
    determinism = document.get("determinism")
    if determinism is not None and not (isinstance(determinism, dict)
                                        and isinstance(determinism.get("deterministic", False), bool)
                                        and isinstance(determinism.get("because", []), list)):
        return "determinism must be an object {deterministic: true or false, because: [...]}"
    return None


def check_plan(baseline: dict, planned: list[tuple[str, str]], methods: list[str], where: Path) -> None:
    """Before the first sample: every method this run has, and every (suite, sample id) of its
    suites for each, must be in the baseline (a renamed method left only vanilla judged)."""
    stored = {(r["suite"], r["sample_id"], r["method"]) for r in baseline["samples"]}
    theirs = list(dict.fromkeys(r["method"] for r in baseline["samples"]))
    for method in methods:
        require(method in theirs, f"--baseline {where} has no records of the method {method!r} (it ran "
                                  f"{', '.join(theirs)}); compare runs of the same --methods")
        for suite, sample in planned:
            require((suite, sample, method) in stored,
                    f"--baseline {where} has no {method} record of {suite}/{sample} (a truncated or smaller run); "
                    "compare runs of the same samples")


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
            resamples: int = 2000, names: set[str] | None = None, unjudged: bool = False) -> list[dict]:
    """One entry per scope x method (both runs') x figure both have (of `names`, if given): the
    two figures and the change with its paired interval. Both runs are priced by the baseline's
    cost curve. `unjudged`: also an entry (with an "unjudged" reason and no figures) where only one
    run has the figure, or where it is not a finite number."""
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
                if entry is not None and (unjudged or "unjudged" not in entry):
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
    named = {"scope": scope, "method": method, "metric": metric.name, "label": metric.label,
             "relative": metric.relative, "deterministic": metric.deterministic}
    if not rows:
        mine, its = (any(v is not None for v in side.values()) for side in (ours, theirs))
        if not (mine or its):
            return None  # neither run has the figure here (no task metric, no widths): nothing to judge
        why = (f"only {'this run' if mine else 'the baseline'} has it" if mine != its
               else "no sample has it in both runs")
        return {**named, "unjudged": why}
    columns = np.array(rows, dtype=np.float64)
    with np.errstate(all="ignore"):
        found = interval(columns, change(metric.shifted(0), metric.shifted(metric.width), metric.relative),
                         resamples=resamples, level=level)
        current_figure = float(metric.shifted(0)(columns.sum(axis=0)[None])[0])
        baseline_figure = float(metric.shifted(metric.width)(columns.sum(axis=0)[None])[0])
    figures = (found.estimate, found.low, found.high, current_figure, baseline_figure)
    if not all(math.isfinite(value) for value in figures):
        return {**named, "unjudged": f"it is not a finite number (baseline {baseline_figure:.4g}, this run "
                                     f"{current_figure:.4g}: no rounds, no tokens or no time)"}
    return {**named, "baseline": baseline_figure, "current": current_figure, "change": found.estimate,
            "low": found.low, "high": found.high, "samples": found.samples, "level": level}


def gate_level(gates: int) -> float:
    """Each gate's two-sided interval level when `gates` are judged (Bonferroni)."""
    return 1.0 - FAMILY_ALPHA / max(1, gates)


UNJUDGED_HINTS = {  # why a limited figure may be missing from every scope and method
    "modelled": "the baseline stores no cost curve, or the records no forward widths",
    "task": "no suite of both runs has a task metric (code suites need --allow-code-execution)",
    "speedup": "no method's samples pair with vanilla's",
}


def regression_gates(current: list[dict], baseline: dict, scopes: list[str], limits: dict[str, float],
                     deterministic: bool = False, allow_unjudged: bool = False) -> list[dict]:
    """One outcome per scope x method x limited figure: failed when the change's interval (at
    gate_level) lies wholly below -tolerance. Figures neither run has for a scope and method (no
    task metric) are left out there. `deterministic`: both runs decoded deterministically
    (greedy, float32, fixed shapes), so their token-derived figures are exact; any other figure
    is statistical and judged only on at least MIN_STATISTICAL_SAMPLES samples.

    A gate that cannot be judged (one run has the figure and the other not, it is not a finite
    number, or no scope and method has it at all) says so and fails, unless `allow_unjudged`
    (--allow-unjudged), where it says so and passes."""
    if not limits:
        return []
    methods = {r["method"] for r in current} & {r["method"] for r in baseline["samples"]}
    count = sum(1 for method in methods for name in limits if method != "vanilla" or METRICS[name].of_vanilla)
    count *= len(scopes)
    entries = compare(current, baseline, scopes, level=gate_level(count), resamples=GATE_RESAMPLES,
                      names=set(limits), unjudged=True)
    outcomes = []
    unjudged_verdict = "passed (--allow-unjudged)" if allow_unjudged else "failed (--allow-unjudged passes it)"
    for entry in entries:
        if entry["metric"] not in limits:
            continue
        gate = f"regression:{entry['metric']}"
        if "unjudged" in entry:
            outcomes.append({"scope": entry["scope"], "method": entry["method"], "gate": gate,
                             "passed": allow_unjudged, "judged": False,
                             "message": f"{entry['scope']}/{entry['method']}: {entry['label']} cannot be judged: "
                                        f"{entry['unjudged']}: {unjudged_verdict}"})
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
        outcomes.append({"scope": entry["scope"], "method": entry["method"], "gate": gate,
                         "passed": not failed,
                         "message": f"{entry['scope']}/{entry['method']}: {figure}: {verdict}"})
    overall = "all" if "all" in scopes else scopes[0]
    for name in limits:
        if any(entry["metric"] == name for entry in entries):
            continue
        metric = METRICS[name]
        hint = UNJUDGED_HINTS.get(name, "no record holds it")
        outcomes.append({"scope": overall, "method": "every method", "gate": f"regression:{name}",
                         "passed": allow_unjudged, "judged": False,
                         "message": f"{overall}: {metric.label} cannot be judged: neither run has it for any suite "
                                    f"and method ({hint}): {unjudged_verdict}"})
    return outcomes
