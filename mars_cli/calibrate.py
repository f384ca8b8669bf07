"""Sampled logits -> per-model MARS thresholds.

The target samples continuations of a prompt set through the ordinary decoding loop; at every
generated position we keep its two largest raw logits (z1, z2). From them each margin measure
gets a threshold that meets an objective:

- `rate=R`: a share R of positions is low-margin (eligible for relaxation);
- `loss=L`: if every eligible position took its runner-up, the target's log-probability given up
  per token, mean over all positions of [eligible] * (z1 - z2) at T = 1, is at most L nats.
  It is an upper bound on MARS's cost: only positions where the drafter proposed the runner-up
  are actually relaxed.

Prompts are split into a fitting part and a held-out part (every fourth prompt); the held-out
positions report how well the fitted threshold meets the objective on text it has not seen, and a
bootstrap over fitting prompts gives the threshold's uncertainty.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from . import __version__
from .decoding.verifiers import MARGIN_MEASURES, margin
from .errors import UserError
from .paths import write_atomic
from .profiles import SCHEMA_VERSION

BUILTIN_PROMPTS = Path(__file__).parent / "data" / "calibration_prompts.jsonl"
DEFAULT_OBJECTIVE = "loss=0.05"
PAPER_THETA = 0.9
QUANTILES = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
HELD_OUT_EVERY = 4


# --------------------------------------------------------------------------- objectives
@dataclass(frozen=True)
class Objective:
    kind: str  # "rate" or "loss"
    value: float

    def __str__(self) -> str:
        return f"{self.kind}={self.value:g}"


def parse_objective(text: str) -> Objective:
    kind, _, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if kind not in ("rate", "loss") or not math.isfinite(number):
        raise UserError(f"--objective {text!r}: expected rate=R (0 < R < 1) or loss=L (L > 0 nats)")
    if kind == "rate" and not 0 < number < 1:
        raise UserError(f"--objective rate must be in (0, 1), got {number}")
    if kind == "loss" and number <= 0:
        raise UserError(f"--objective loss must be > 0 nats, got {number}")
    return Objective(kind, number)


# --------------------------------------------------------------------------- the estimators
@dataclass
class MarginSample:
    """Top-two raw logits of the sampled positions, grouped by prompt."""

    z1: list[torch.Tensor] = field(default_factory=list)
    z2: list[torch.Tensor] = field(default_factory=list)

    def add(self, z1: torch.Tensor, z2: torch.Tensor) -> None:
        self.z1.append(z1.float().cpu())
        self.z2.append(z2.float().cpu())

    def positions(self, groups: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = range(len(self.z1)) if groups is None else groups
        if not len(chosen):
            return torch.empty(0), torch.empty(0)
        return torch.cat([self.z1[g] for g in chosen]), torch.cat([self.z2[g] for g in chosen])

    def __len__(self) -> int:
        return sum(t.numel() for t in self.z1)


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
    if objective.kind == "rate":
        return threshold_for_rate(margins, objective.value)
    return threshold_for_loss(margins, gaps, objective.value)


def measured(margins: torch.Tensor, gaps: torch.Tensor, theta: float) -> dict[str, float]:
    eligible = margins > theta
    return {"rate": float(eligible.double().mean()), "loss": float((gaps.double() * eligible).mean())}


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


# --------------------------------------------------------------------------- prompts
def load_prompts(path: Path | None, builtin: Path = BUILTIN_PROMPTS, least: int = 2) -> tuple[list[str], str, str]:
    """(prompts, name, sha256 of the file's bytes). JSONL with a `prompt` field per line;
    `builtin` when no path is given; at least `least` prompts (some are held out)."""
    source = path or builtin
    try:
        raw = source.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read prompts file {source}: {exc.strerror or exc}") from None
    prompts = []
    for number, line in enumerate(raw.decode("utf-8", errors="strict").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            prompt = record["prompt"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{source}: line {number} is not a JSON object with a 'prompt' field") from None
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError(f"{source}: line {number} has an empty or non-text prompt")
        prompts.append(prompt)
    if len(prompts) < least:
        raise UserError(f"{source}: needs at least {least} prompts (some are held out), found {len(prompts)}")
    name = "builtin" if path is None else str(path)
    return prompts, name, hashlib.sha256(raw).hexdigest()


def split_prompts(count: int) -> tuple[list[int], list[int]]:
    held = [i for i in range(count) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1] or [count - 1]
    return [i for i in range(count) if i not in held], held


# --------------------------------------------------------------------------- collection
def collect(session, prompts: list[str], indices: list[int], positions: int, seed: int,
            advance: Callable[[int], None], sample: MarginSample | None = None,
            checkpoint: Callable[[MarginSample], None] | None = None) -> MarginSample:
    """Sample continuations, cycling through `indices` (seed + call number each), until
    `positions` generated positions are collected; each continuation is one group. Passing a
    partial `sample` resumes exactly where it stopped (the call number is its group count);
    `checkpoint` is called after every continuation so an interrupted run loses at most one."""
    sample = sample if sample is not None else MarginSample()
    encoded = {i: session.encode(prompts[i]) for i in indices}
    call = len(sample.z1)
    advance(len(sample))
    while len(sample) < positions:
        index = indices[call % len(indices)]
        z1_rows: list[torch.Tensor] = []
        z2_rows: list[torch.Tensor] = []

        def observe(logits: torch.Tensor) -> None:
            top = logits.topk(2, dim=-1).values
            z1_rows.append(top[:, 0])
            z2_rows.append(top[:, 1])

        session.run(encoded[index], observe=observe, seed=seed + call)
        call += 1
        room = positions - len(sample)
        z1 = torch.cat(z1_rows)[:room] if z1_rows else torch.empty(0)
        z2 = torch.cat(z2_rows)[:room] if z2_rows else torch.empty(0)
        sample.add(z1, z2)  # an empty group keeps the call count (and so the seeds) in step
        advance(z1.numel())
        if checkpoint is not None:
            checkpoint(sample)
    return sample


def save_partial(path: Path, signature: dict, fit_sample: MarginSample, held_sample: MarginSample | None) -> None:
    """Collected logits so far, written atomically next to the profile."""
    def dump(sample: MarginSample | None) -> list | None:
        return None if sample is None else [[a.tolist(), b.tolist()] for a, b in zip(sample.z1, sample.z2)]

    write_atomic(path, json.dumps({"signature": signature, "fit": dump(fit_sample), "held": dump(held_sample)}))


def load_partial(path: Path, signature: dict) -> tuple[MarginSample, MarginSample | None]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        raise UserError(f"nothing to resume: {path} is missing or unreadable") from None
    if data.get("signature") != json.loads(json.dumps(signature)):
        raise UserError(f"--resume: the options differ from the interrupted run in {path}")

    def load(groups: list | None) -> MarginSample | None:
        if groups is None:
            return None
        sample = MarginSample()
        for z1, z2 in groups:
            sample.add(torch.tensor(z1, dtype=torch.float32), torch.tensor(z2, dtype=torch.float32))
        return sample

    return load(data["fit"]) or MarginSample(), load(data["held"])


# --------------------------------------------------------------------------- the profile
def build_profile(session, fit_sample: MarginSample, held_sample: MarginSample, objective: Objective,
                  temperature: float, prompt_set: dict, command: str, seed: int) -> dict:
    z1, z2 = fit_sample.positions()
    hz1, hz2 = held_sample.positions()
    gaps, held_gaps = z1 - z2, hz1 - hz2
    groups = list(range(len(fit_sample.z1)))
    thresholds, quantiles, held_out, intervals, paper = {}, {}, {}, {}, {}
    for measure in MARGIN_MEASURES:
        values = margin(z1, z2, measure)  # type: ignore[arg-type]
        theta = fit(values, gaps, objective)
        thresholds[measure] = round(theta, 6)
        finite = values[torch.isfinite(values)]
        quantiles[measure] = {str(q): round(float(finite.quantile(q)), 6) for q in QUANTILES} if finite.numel() else {}
        low, high = bootstrap_interval(fit_sample, groups, measure, objective, seed=seed)
        intervals[measure] = [round(low, 6), round(high, 6)]
        held = measured(margin(hz1, hz2, measure), held_gaps, theta)  # type: ignore[arg-type]
        held_out[measure] = {k: round(v, 6) for k, v in held.items()}
        at_paper = measured(values, gaps, PAPER_THETA)
        paper[measure] = {k: round(v, 6) for k, v in at_paper.items()}
    target = session.target
    return {
        "schema": SCHEMA_VERSION,
        "model": {
            "name": target.spec,
            "source": target.source,
            "fingerprint": target.fingerprint,
            "vocab_size": target.vocab_size,
        },
        "thresholds": thresholds,
        "temperature": temperature,
        "objective": {"kind": objective.kind, "value": objective.value},
        "samples": len(fit_sample),
        "held_out_samples": len(held_sample),
        "prompt_set": prompt_set,
        "quantiles": quantiles,
        "threshold_interval_90": intervals,
        "held_out": held_out,
        "at_paper_theta_0.9": paper,
        "top1_logit_nonpositive_share": round(float((z1 <= 0).float().mean()), 6),
        "tool_version": __version__,
        "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
    }
