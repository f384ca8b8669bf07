"""`mars eval`'s results document: what was run, the aggregated table and the CI gates.

Kept apart from the CLI so that the document (results.json, report.md, `--json`) has one builder
that tests and other front ends can call, and the CLI only renders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import require
from ..options import DecodingOptions
from ..session import Session
from .aggregate import aggregate, scopes
from .baseline import compare, regression_gates
from .figures import curve_from, sample_figures
from .methods import Method
from .suites import Suite


@dataclass(frozen=True)
class Gates:
    """CI thresholds (--min-speedup, --max-quality-drop, --max-regression); None or {} leaves a gate off."""

    min_speedup: float | None = None
    max_quality_drop: float | None = None
    max_regression: dict[str, float] = field(default_factory=dict)  # figure -> tolerance, against --baseline
    allow_unjudged: bool = False  # a regression gate that cannot be judged passes (said so) instead of failing

    def validate(self) -> None:
        for name, value in (("--min-speedup", self.min_speedup), ("--max-quality-drop", self.max_quality_drop)):
            require(value is None or (value == value and value >= 0), f"{name} must be a number >= 0, got {value}")

    @property
    def active(self) -> bool:
        return self.min_speedup is not None or self.max_quality_drop is not None or bool(self.max_regression)


def _outcome(scope: str, method: str, gate: str, failure: str | None, passed_message: str) -> dict:
    return {"scope": scope, "method": method, "gate": gate, "passed": failure is None,
            "message": failure or passed_message}


def check_gates(rows: list[dict], min_speedup: float | None, max_quality_drop: float | None,
                scope: str = "all") -> list[dict]:
    """One outcome per method and gate: {"scope", "method", "gate", "passed", "message"}. The speed
    gate fails only when the speedup's whole interval (from the per-sample ratios) is below the
    limit; a row without an interval is judged on its figure."""
    outcomes = []
    base = next((row for row in rows if row["method"] == "vanilla"), None)
    for row in rows:
        name = row["method"]
        if name == "vanilla":
            continue
        if min_speedup is not None:
            speedup = row["speedup"] or 0.0
            low, high = row.get("intervals", {}).get("speedup", (speedup, speedup))
            span = f"{speedup:.3f}x [{low:.3f}, {high:.3f}]"
            failure = (f"{name}: speedup {span}: the whole interval is below {min_speedup}x"
                       if high < min_speedup else None)
            outcomes.append(_outcome(scope, name, "min-speedup", failure,
                                     f"{name}: speedup {span}: {min_speedup}x is not above its interval"))
        if max_quality_drop is None:
            continue
        failure = None
        if base and base["task_metric"] is not None and row["task_metric"] is not None:
            drop = base["task_metric"] - row["task_metric"]
            if drop > max_quality_drop:
                failure = f"{name}: task metric drops by {drop:.3f} > {max_quality_drop}"
        if failure is None and row["agreement_rouge_l"] is not None and 1 - row["agreement_rouge_l"] > max_quality_drop:
            failure = (f"{name}: agreement with vanilla (ROUGE-L) {row['agreement_rouge_l']:.3f} "
                       f"is more than {max_quality_drop} below 1")
        outcomes.append(_outcome(scope, name, "max-quality-drop", failure,
                                 f"{name}: task metric and agreement within {max_quality_drop} of vanilla"))
    return outcomes


def failures_of(outcomes: list[dict]) -> list[str]:
    return [o["message"] for o in outcomes if not o["passed"]]


def run_signature(specs: list[str], limit: int | None, methods: list[Method], repeats: int,
                  options: DecodingOptions, engine: dict | None = None) -> dict:
    """What makes two runs the same run for --resume: not where they ran (device, device map).
    `engine`: another engine's settings (--engine vllm and its batch size); ours adds nothing."""
    signature = {"suites": specs, "limit": limit, "methods": [m.name for m in methods], "repeats": repeats,
                 "options": {k: v for k, v in options.flat().items() if k not in ("device", "device_map")}}
    return signature if engine is None else {**signature, "engine": engine}


def describe_sessions(methods: list[Method], sessions: dict[str, Session]) -> tuple[dict, dict]:
    """(config, per-method details) of a run in our own loop: the settings the non-vanilla methods
    decoded with, and each method's resolved threshold and tree."""
    described = sessions[next((m.name for m in methods if m.name != "vanilla"), "vanilla")]
    details = {m.name: {**m.changes, **_threshold(sessions[m.name]), **_tree(sessions[m.name])} for m in methods}
    return described.config(), details


def determinism(options: DecodingOptions, methods: list[Method], dtype: str) -> dict:
    """Whether this run's token-derived figures (figures.py) repeat exactly, and if not, why."""
    because = []
    if options.sampling.temperature > 0:
        because.append("sampled (seeded: repeatable on one machine, but a gate on it is statistical)")
    if dtype != "float32":
        because.append(f"{dtype}: reduced-precision kernels round differently from one CPU to another")
    if options.model.dtype == "auto" and options.model.engine != "llama.cpp":
        because.append("--dtype auto chooses by this machine's timings")
    if options.model.packed_weights == "auto" and dtype == "float32" and options.model.engine != "llama.cpp":
        because.append("--packed-weights auto chooses the float32 kernels by this machine's timings")
    drafting = [options.replace(**m.changes).drafting for m in methods if m.name != "vanilla"]
    drafting = [d for d in drafting if d.drafts]
    if any(d.adaptive for d in drafting):
        because.append("--num-draft auto picks each round's length from live timings")
    if any(d.draft_topk == "auto" or (d.draft_topk != 1 and d.draft_tokens == "auto") for d in drafting):
        because.append("--draft-topk/--draft-tokens auto choose the tree from this machine's cost curve")
    if any(d.draft.startswith("head") and d.int8_head == "auto" for d in drafting):
        because.append("--int8-head auto chooses by this machine's timings")
    return {"deterministic": not because, "because": because}


def build_results(command: str, suites: list[Suite], methods: list[Method], described: tuple[dict, dict],
                  repeats: int, complete: bool, records: list[dict], gates: Gates, *,
                  identity: dict | None = None, cost_curve: dict | None = None, determinism: dict | None = None,
                  baseline: tuple[dict, str] | None = None) -> tuple[dict, list[str]]:
    """(the results document, the gate failures). `described`: (config, per-method details), from
    describe_sessions or another engine's. `cost_curve` ({"ms_by_width", "source"}) prices the
    modelled speedup; `baseline`: (a stored results document, where it came from) to compare with.
    The table's overall scope ("all" across several suites, else the one suite) is what the
    speedup and quality gates judge; regression gates judge every scope."""
    config, details = described
    names = [s.name for s in suites]
    curve = curve_from((cost_curve or {}).get("ms_by_width"))
    figures = sample_figures(records)
    results = {
        "command": command,
        "suites": names,
        "config": config,  # the drafter and flags the non-vanilla methods used
        "methods": details,
        "repeats": repeats,
        "complete": complete,
        "identity": identity or {},
        "determinism": determinism or {"deterministic": False, "because": ["not recorded"]},
        "cost_curve": cost_curve,
        "table": aggregate(records, methods, names, curve, figures),
    }
    overall = "all" if len(suites) > 1 else names[0]
    outcomes = check_gates(results["table"][overall], gates.min_speedup, gates.max_quality_drop, overall)
    if baseline is not None:
        document, where = baseline
        results["baseline"] = {"path": where, "identity": document["identity"],
                               "comparisons": compare(figures, document, scopes(names))}
        exact = results["determinism"]["deterministic"] and (document.get("determinism") or {}).get("deterministic", False)
        outcomes += regression_gates(figures, document, scopes(names), gates.max_regression, exact,
                                     gates.allow_unjudged)
    results["samples"] = figures
    if gates.active:
        results["gates"] = {"min_speedup": gates.min_speedup, "max_quality_drop": gates.max_quality_drop,
                            "max_regression": gates.max_regression, "outcomes": outcomes,
                            "failures": failures_of(outcomes)}
    return results, failures_of(outcomes)


def _tree(session: Session) -> dict:
    """The draft-tree shape a method decoded with (resolved from `auto`), when it drafts a tree."""
    shape = session.tree
    return {"tree": f"{shape.topk}x{shape.tokens}"} if shape.topk > 1 else {}


def _threshold(session: Session) -> dict:
    """A MARS method's resolved threshold and where it came from (flag, profile, default)."""
    if session.options.verification.verify != "mars":
        return {}
    return {"threshold": session.threshold.value, "threshold_source": session.threshold.source}
