"""`mars eval`'s results document: what was run, the aggregated table and the CI gates.

Kept apart from the CLI so that the document (results.json, report.md, `--json`) has one builder
that tests and other front ends can call, and the CLI only renders it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import require
from ..options import DecodingOptions
from ..session import Session
from .aggregate import aggregate
from .methods import Method
from .suites import Suite


@dataclass(frozen=True)
class Gates:
    """CI thresholds (--min-speedup, --max-quality-drop); None leaves a gate off."""

    min_speedup: float | None = None
    max_quality_drop: float | None = None

    def validate(self) -> None:
        for name, value in (("--min-speedup", self.min_speedup), ("--max-quality-drop", self.max_quality_drop)):
            require(value is None or (value == value and value >= 0), f"{name} must be a number >= 0, got {value}")

    @property
    def active(self) -> bool:
        return self.min_speedup is not None or self.max_quality_drop is not None


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


def build_results(command: str, suites: list[Suite], methods: list[Method], described: tuple[dict, dict],
                  repeats: int, complete: bool, records: list[dict], gates: Gates) -> tuple[dict, list[str]]:
    """(the results document, the gate failures). `described`: (config, per-method details), from
    describe_sessions or another engine's. The table's overall scope ("all" across several suites,
    else the one suite) is what the gates judge."""
    config, details = described
    names = [s.name for s in suites]
    results = {
        "command": command,
        "suites": names,
        "config": config,  # the drafter and flags the non-vanilla methods used
        "methods": details,
        "repeats": repeats,
        "complete": complete,
        "table": aggregate(records, methods, names),
    }
    overall = results["table"]["all" if len(suites) > 1 else names[0]]
    failures = check_gates(overall, gates.min_speedup, gates.max_quality_drop)
    if gates.active:
        results["gates"] = {"min_speedup": gates.min_speedup, "max_quality_drop": gates.max_quality_drop,
                            "failures": failures}
    return results, failures


def _tree(session: Session) -> dict:
    """The draft-tree shape a method decoded with (resolved from `auto`), when it drafts a tree."""
    shape = session.tree
    return {"tree": f"{shape.topk}x{shape.tokens}"} if shape.topk > 1 else {}


def _threshold(session: Session) -> dict:
    """A MARS method's resolved threshold and where it came from (flag, profile, default)."""
    if session.options.verification.verify != "mars":
        return {}
    return {"threshold": session.threshold.value, "threshold_source": session.threshold.source}
