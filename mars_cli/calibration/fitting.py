"""From collected margins (or a quality sweep) to the profile: one block per decoding mode, with
the evidence behind its thresholds, and the assembled document that profiles.save validates.

A rate= / loss= block carries each measure's threshold, its bootstrap interval over fitting
prompts, the margin quantiles, the held-out check and what the paper's 0.9 would mean; a
quality= block carries the chosen theta, the sweep that chose it and the loss bound beside it.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import TYPE_CHECKING, Sequence

import torch

from .. import __version__
from ..decoding.rules import MARGIN_MEASURES, margin
from .collection import MarginSample
from .objectives import Objective, fit, measured
from .profiles import SCHEMA_VERSION, to_raw
from .sweep import ModeRun, sweep_block

if TYPE_CHECKING:
    from ..session import Session

LOSS_BESIDE = 0.05  # the loss bound reported beside every quality fit, nats/token
PAPER_THETA = 0.9
QUANTILES = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)


def bootstrap_interval(sample: MarginSample, groups: Sequence[int], measure: str, objective: Objective,
                       resamples: int = 200, seed: int = 0) -> tuple[float, float]:
    """5%-95% interval of the fitted threshold, resampling whole prompts (positions within a
    continuation are correlated, so resampling positions would understate the spread)."""
    rng = random.Random(seed)
    fitted = []
    for _ in range(resamples):
        chosen = [rng.choice(groups) for _ in groups]
        z1, z2 = sample.positions(chosen)
        fitted.append(fit(margin(z1, z2, measure), z1 - z2, objective))  # type: ignore[arg-type]
    fitted.sort()
    return fitted[int(0.05 * (resamples - 1))], fitted[int(0.95 * (resamples - 1))]


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in values.items()}


def _quantiles(values: torch.Tensor) -> dict[str, float]:
    finite = values[torch.isfinite(values)]
    return {str(q): round(float(finite.quantile(q)), 6) for q in QUANTILES} if finite.numel() else {}


def fit_block(fit_sample: MarginSample, held_sample: MarginSample, objective: Objective, temperature: float,
              seed: int) -> dict:
    """One mode fitted to a rate or loss objective: thresholds per measure, their bootstrap
    interval, the margin quantiles, the held-out check and what the paper's 0.9 would mean."""
    z1, z2 = fit_sample.positions()
    hz1, hz2 = held_sample.positions()
    gaps, held_gaps = z1 - z2, hz1 - hz2
    groups = list(range(len(fit_sample.z1)))
    thresholds, quantiles, held_out, intervals, paper = {}, {}, {}, {}, {}
    for measure in MARGIN_MEASURES:
        values = margin(z1, z2, measure)  # type: ignore[arg-type]
        theta = fit(values, gaps, objective)
        thresholds[measure] = round(theta, 6)
        quantiles[measure] = _quantiles(values)
        low, high = bootstrap_interval(fit_sample, groups, measure, objective, seed=seed)
        intervals[measure] = [round(low, 6), round(high, 6)]
        held_out[measure] = _rounded(measured(margin(hz1, hz2, measure), held_gaps, theta))  # type: ignore[arg-type]
        paper[measure] = _rounded(measured(values, gaps, PAPER_THETA))
    return {
        "temperature": temperature,
        "thresholds": thresholds,
        "objective": {"kind": objective.kind, "value": objective.value},
        "positions": len(fit_sample),
        "held_out_positions": len(held_sample),
        "quantiles": quantiles,
        "threshold_interval_90": intervals,
        "held_out": held_out,
        "at_paper_theta_0.9": paper,
        "top1_logit_nonpositive_share": round(float((z1 <= 0).float().mean()), 6) if z1.numel() else 0.0,
    }


def quality_block(run: ModeRun, drop: float, measure: str, temperature: float, drafter: str,
                  max_new_tokens: int, seed: int) -> dict:
    """One mode fitted to the quality objective: the chosen theta (1.0, nothing relaxed, when no
    swept theta clearly held quality), the sweep with its decision and power estimate, and beside
    it the loss bound fitted on the positions strict visited in this mode."""
    sample = MarginSample.from_lists(run.z1, run.z2)
    z1, z2 = sample.positions()
    gaps = z1 - z2
    sweep = sweep_block(run, drop, measure, seed)
    chosen = to_raw(sweep["chosen"] if sweep["chosen"] is not None else 1.0, measure, temperature)
    bound = Objective("loss", LOSS_BESIDE)
    return {
        "temperature": temperature,
        "thresholds": {measure: round(chosen, 6)},
        "objective": {"kind": "quality", "value": drop},
        "positions": len(sample),
        "quantiles": {m: _quantiles(margin(z1, z2, m)) for m in MARGIN_MEASURES},  # type: ignore[arg-type]
        "loss_bound": {
            "objective": {"kind": bound.kind, "value": bound.value},
            "thresholds": {m: round(fit(margin(z1, z2, m), gaps, bound), 6) for m in MARGIN_MEASURES},  # type: ignore[arg-type]
            "at_chosen": _rounded(measured(margin(z1, z2, measure), gaps, chosen)),  # type: ignore[arg-type]
        },
        "drafter": drafter,
        "max_new_tokens": max_new_tokens,
        "sweep": sweep,
    }


def assemble(session: Session, modes: dict[str, dict], objective: Objective, prompt_set: dict, command: str) -> dict:
    """The profile: per-mode blocks under `modes`; at the top level the fields the schema
    requires (profiles.REQUIRED), from the sampled mode (the greedy one when there is no sampled
    mode), so a reader of schema-1 files still finds sampled thresholds where they were."""
    primary = modes.get("sampled") or modes["greedy"]
    target = session.target
    return {
        "schema": SCHEMA_VERSION,
        "model": {
            "name": target.spec,
            "source": target.source,
            "fingerprint": target.fingerprint,
            "vocab_size": target.vocab_size,
        },
        "thresholds": primary["thresholds"],
        "temperature": primary["temperature"],
        "objective": {"kind": objective.kind, "value": objective.value},
        "samples": primary["positions"],
        **({"held_out_samples": primary["held_out_positions"]} if "held_out_positions" in primary else {}),
        "prompt_set": prompt_set,
        "quantiles": primary["quantiles"],
        "modes": modes,
        "tool_version": __version__,
        "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
    }
