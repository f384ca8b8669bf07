"""What a calibration aims for (`--objective`) and the estimators that fit a threshold to it.

- `rate=R`: a share R of positions is low-margin (eligible for relaxation);
- `loss=L`: if every eligible position took its runner-up, the target's log-probability given up
  per token, mean over all positions of [eligible] * (z1 - z2) at T = 1, is at most L nats.
  It is an upper bound on MARS's cost: only positions where the drafter proposed the runner-up
  are actually relaxed.
- `quality=DROP`: measured instead of bounded (mars_cli/calibration/sweep.py): the most
  permissive theta whose task metrics and mean log-probability stay within DROP of strict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import UserError

DEFAULT_OBJECTIVE = "loss=0.05"


@dataclass(frozen=True)
class Objective:
    kind: str  # "rate", "loss" or "quality"
    value: float

    def __str__(self) -> str:
        return f"{self.kind}={self.value:g}"


def parse_objective(text: str) -> Objective:
    """`rate=R`, `loss=L` or `quality=DROP`; anything else is one sentence naming the forms."""
    kind, _, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if kind not in ("rate", "loss", "quality") or not math.isfinite(number):
        raise UserError(f"--objective {text!r}: expected rate=R (0 < R < 1), loss=L (L > 0 nats) "
                        "or quality=DROP (a relative drop in (0, 1))")
    if kind == "quality" and not 0 < number < 1:
        raise UserError(f"--objective quality=DROP needs a relative drop in (0, 1), e.g. quality=0.02; got {number}")
    if kind == "rate" and not 0 < number < 1:
        raise UserError(f"--objective rate must be in (0, 1), got {number}")
    if kind == "loss" and number <= 0:
        raise UserError(f"--objective loss must be > 0 nats, got {number}")
    return Objective(kind, number)


def threshold_for_rate(margins: torch.Tensor, rate: float) -> float:
    """Largest theta with share(margin > theta) <= rate, i.e. the (count+1)-th largest margin."""
    ordered = margins.sort(descending=True).values
    count = min(int(math.floor(rate * ordered.numel())), ordered.numel() - 1)
    return _clamp(float(ordered[count]))


def threshold_for_loss(margins: torch.Tensor, gaps: torch.Tensor, budget: float) -> float:
    """Lowest theta (most positions eligible) whose mean given-up log-probability is <= budget."""
    order = margins.argsort(descending=True)
    ordered, cost = margins[order], gaps[order].double().cumsum(0) / margins.numel()
    affordable = int((cost <= budget).sum())  # cost is non-decreasing: a prefix is affordable
    affordable = min(affordable, ordered.numel() - 1)
    return _clamp(float(ordered[affordable]))


def _clamp(theta: float) -> float:
    """Thresholds live in (0, 1]; -inf margins (never eligible) map to the smallest theta."""
    if not math.isfinite(theta) or theta <= 0:
        return 1e-6
    return min(theta, 1.0)


def fit(margins: torch.Tensor, gaps: torch.Tensor, objective: Objective) -> float:
    """The threshold meeting a rate or loss objective on these positions (gaps: z1 - z2)."""
    if objective.kind == "rate":
        return threshold_for_rate(margins, objective.value)
    return threshold_for_loss(margins, gaps, objective.value)


def measured(margins: torch.Tensor, gaps: torch.Tensor, theta: float) -> dict[str, float]:
    """The rate and loss a threshold actually gives on these positions (the held-out check)."""
    eligible = margins > theta
    return {"rate": float(eligible.double().mean()), "loss": float((gaps.double() * eligible).mean())}
