"""Percentile bootstrap intervals over samples, for figures that are functions of column sums.

Every figure `mars eval` reports is a ratio of sums over samples (tau: tokens over rounds; tokens/s:
tokens over seconds; a task metric: scores over samples), and a comparison is such a figure in one
run against the same figure in another, over the samples both hold. Resampling the samples (rows)
and recomputing the figure from the resampled sums gives its interval; pairing (the two runs'
columns side by side in one row) makes the interval of a change as narrow as the runs' agreement
allows. The generator is seeded, so the same figures give the same interval on any machine: a gate
on a deterministic figure stays deterministic (an unchanged run's change is exactly 0, [0, 0]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

LEVEL = 0.95
RESAMPLES = 2000
SEED = 20260115  # fixed: intervals are reproducible, never a source of flakes

Statistic = Callable[[np.ndarray], np.ndarray]  # column sums [..., c] -> the figure [...]


@dataclass(frozen=True)
class Interval:
    """A figure and its 95% interval; `samples`: the rows it rests on."""

    estimate: float
    low: float
    high: float
    samples: int

    def fields(self) -> dict:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "samples": self.samples}

    def __str__(self) -> str:
        return f"{self.estimate:+.4g} [{self.low:+.4g}, {self.high:+.4g}]"


def interval(columns: np.ndarray, statistic: Statistic, resamples: int = RESAMPLES, seed: int = SEED,
             level: float = LEVEL) -> Interval:
    """The figure `statistic(sums of columns)` with its `level` percentile interval from `resamples`
    bootstrap draws of the rows. Draws where the figure is undefined (a zero denominator) are
    left out; with none left the interval is the estimate itself."""
    columns = np.asarray(columns, dtype=np.float64)
    rows = columns.shape[0]
    if rows == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = float(statistic(columns.sum(axis=0)[None, :])[0])
        counts = np.random.default_rng(seed).multinomial(rows, np.full(rows, 1.0 / rows), size=resamples)
        values = statistic(counts.astype(np.float64) @ columns)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Interval(estimate, estimate, estimate, rows)
    tail = (1.0 - level) / 2
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return Interval(estimate, float(min(low, estimate)), float(max(high, estimate)), rows)


def ratio(numerator: int, denominator: int) -> Statistic:
    """sum(column numerator) / sum(column denominator)."""
    return lambda sums: sums[..., numerator] / sums[..., denominator]


def change(current: Statistic, baseline: Statistic, relative: bool) -> Statistic:
    """current - baseline, or current / baseline - 1 when `relative`."""
    if relative:
        return lambda sums: current(sums) / baseline(sums) - 1.0
    return lambda sums: current(sums) - baseline(sums)
