"""`mars eval`'s results document: what was run, the aggregated table and the CI gates.

Kept apart from the CLI so that the document (results.json, report.md, `--json`) has one builder
that tests and other front ends can call, and the CLI only renders it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import require
from ..options import DecodingOptions
from ..session import Session
from .runner import Method, aggregate, check_gates
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


def run_signature(specs: list[str], limit: int | None, methods: list[Method], repeats: int,
                  options: DecodingOptions) -> dict:
    """What makes two runs the same run for --resume: not where they ran (device, device map)."""
    return {"suites": specs, "limit": limit, "methods": [m.name for m in methods], "repeats": repeats,
            "options": {k: v for k, v in options.flat().items() if k not in ("device", "device_map")}}


def build_results(command: str, suites: list[Suite], methods: list[Method], sessions: dict[str, Session],
                  repeats: int, complete: bool, records: list[dict], gates: Gates) -> tuple[dict, list[str]]:
    """(the results document, the gate failures). The table's overall scope ("all" across several
    suites, else the one suite) is what the gates judge."""
    described = sessions[next((m.name for m in methods if m.name != "vanilla"), "vanilla")]
    names = [s.name for s in suites]
    results = {
        "command": command,
        "suites": names,
        "config": described.config(),  # the drafter and flags the non-vanilla methods used
        "methods": {m.name: {**m.changes, **_threshold(sessions[m.name]), **_tree(sessions[m.name])} for m in methods},
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
