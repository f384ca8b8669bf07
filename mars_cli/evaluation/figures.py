"""The figures `mars eval` reports and compares, each defined once: its per-sample columns and the
function of their sums that gives it (bootstrap.py resamples the samples).

A sample's record keeps what every figure needs (`sample_figures`): tokens, rounds, the widths of
its target forwards, seconds, the task score, the log-probability and the agreement with vanilla's
output for the same sample. That compact record is stored in results.json, so a stored run is a
baseline by itself.

Which figures are deterministic: tau, forwards per token, the modelled speedup (the widths priced
by one fixed cost curve), the task metric, agreement and log-probability depend only on the tokens
decoded. At temperature 0 in float32, with a fixed draft shape (a number for --num-draft,
--draft-topk and --draft-tokens, --int8-head off), the same code decodes the same tokens on one
machine every time. `--num-draft auto` picks each round's length from live timings, and
`--dtype auto` / `--int8-head auto` from this machine's measurements: with any of them, these
figures move with the machine's speed. The wall speedup is never deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from ..decoding.cost import CostCurve
from .bootstrap import Interval, Statistic, interval, ratio
from .metrics import rouge_l, token_agreement

Columns = Callable[[dict, "dict | None", "CostCurve | None"], "tuple[float, ...] | None"]


def _speedup(sums: np.ndarray) -> np.ndarray:
    """(method tokens / method seconds) / (vanilla tokens / vanilla seconds)."""
    return (sums[..., 0] / sums[..., 1]) / (sums[..., 2] / sums[..., 3])


@dataclass(frozen=True)
class Metric:
    """One reported figure. `relative`: a change is a share of the baseline's figure (current /
    baseline - 1) rather than a difference; every figure is better when higher."""

    name: str  # as --max-regression names it
    key: str  # its field in a table row
    label: str
    relative: bool
    deterministic: bool  # depends on the decoded tokens only (see the module's docstring)
    columns: Columns
    figure: Statistic
    width: int  # how many columns
    of_vanilla: bool = False  # meaningful for vanilla itself (the others are 1 there by definition)

    def shifted(self, offset: int) -> Statistic:
        """The figure over columns [offset, offset + width) of a wider row (a paired comparison)."""
        return lambda sums: self.figure(sums[..., offset:offset + self.width])


def _priced(widths: Mapping[str, int], curve: CostCurve) -> float:
    """Milliseconds the sample's target forwards cost on `curve`."""
    return sum(count * curve.cost(int(width)) for width, count in widths.items())


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("tau", "tau", "tau (tokens per round)", True, True,
           lambda r, v, c: (r["new_tokens"], r["rounds"]), ratio(0, 1), 2),
    Metric("modelled", "modelled_speedup", "modelled speedup", True, True,
           lambda r, v, c: None if c is None or not r.get("widths") else
           (r["new_tokens"] * c.cost(1), _priced(r["widths"], c)), ratio(0, 1), 2),
    Metric("speedup", "speedup", "wall speedup", True, False,
           lambda r, v, c: None if v is None or not r["wall_s"] or not v["wall_s"] else
           (r["new_tokens"], r["wall_s"], v["new_tokens"], v["wall_s"]), _speedup, 4),
    Metric("task", "task_metric", "task metric", False, True,
           lambda r, v, c: None if r.get("task_score") is None else (r["task_score"], 1.0), ratio(0, 1), 2, True),
    Metric("agreement", "agreement_rouge_l", "agreement with vanilla (ROUGE-L)", False, True,
           lambda r, v, c: None if r.get("agreement_rouge_l") is None else (r["agreement_rouge_l"], 1.0),
           ratio(0, 1), 2),
    Metric("logprob", "mean_logprob", "mean log-probability", False, True,
           lambda r, v, c: None if not r["new_tokens"] else (r["sum_logprob"], r["new_tokens"]), ratio(0, 1), 2,
           True),
)}


def sample_figures(records: list[dict]) -> list[dict]:
    """Each finished record cut to what the figures need, with its agreement with vanilla's output
    for the same sample (None for vanilla itself and where vanilla has not run it)."""
    vanilla = {(r["suite"], r["sample_id"]): r for r in records if r["method"] == "vanilla"}
    figures = []
    for record in records:
        base = vanilla.get((record["suite"], record["sample_id"]))
        paired = base is not None and record["method"] != "vanilla"
        figures.append({
            "suite": record["suite"], "sample_id": record["sample_id"], "method": record["method"],
            "new_tokens": record["new_tokens"], "rounds": record["rounds"],
            "widths": record.get("widths") or {}, "wall_s": record["wall_s"],
            "walls": record.get("walls", [record["wall_s"]]),
            "task_score": record.get("task_score"), "sum_logprob": record["sum_logprob"],
            "agreement_tokens": token_agreement(record["token_ids"], base["token_ids"]) if paired else None,
            "agreement_rouge_l": rouge_l(record["token_ids"], base["token_ids"]) if paired else None,
        })
    return figures


def forwards_per_token(figures: list[dict]) -> tuple[float | None, float | None]:
    """(target forwards per emitted token, mean width of a forward) over these samples; None
    where the records carry no widths (a run by an older mars, or another engine's)."""
    forwards = sum(sum(f["widths"].values()) for f in figures)
    if not forwards:
        return None, None
    fed = sum(int(w) * n for f in figures for w, n in f["widths"].items())
    tokens = sum(f["new_tokens"] for f in figures)
    return forwards / tokens if tokens else None, fed / forwards


def curve_from(ms_by_width: Mapping[str | int, float] | None) -> CostCurve | None:
    """A stored curve ({width: ms}) as the CostCurve that prices widths (None stays None)."""
    if not ms_by_width:
        return None
    return CostCurve({}, {int(w): float(ms) for w, ms in ms_by_width.items()})


def _vanilla_of(figures: list[dict]) -> dict[tuple[str, str], dict]:
    return {(f["suite"], f["sample_id"]): f for f in figures if f["method"] == "vanilla"}


def within(metric: Metric, mine: list[dict], vanilla: Mapping[tuple[str, str], dict],
           curve: CostCurve | None) -> Interval | None:
    """One method's figure over its samples in one run, with its interval (None where no sample
    has the figure: no task metric, no widths, no vanilla to pair with)."""
    rows = [cols for f in mine
            if (cols := metric.columns(f, vanilla.get((f["suite"], f["sample_id"])), curve)) is not None]
    return interval(np.array(rows), metric.figure) if rows else None
