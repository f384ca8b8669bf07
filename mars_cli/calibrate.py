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

`CalibrationRequest` (the calibrate flags) and `Calibration` (one run: prompts, resume, sampling
passes, profile) hold the command's steps, so that the CLI only parses flags, shows progress and
renders the profile.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from . import __version__, calibration_profiles
from .calibration_profiles import SCHEMA_VERSION
from .decoding.verifiers import MARGIN_MEASURES, TopTwoRecorder, margin
from .errors import UserError, check_seed, require
from .paths import user_profile_dir, write_atomic
from .prompts import held_out, load_prompts

if TYPE_CHECKING:
    from .options import DecodingOptions

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
def split_prompts(count: int) -> tuple[list[int], list[int]]:
    """(fitting, held-out) prompt indices: every HELD_OUT_EVERY-th prompt is held out, and the
    last one when there are fewer, so the held-out check always has a prompt."""
    fitting, held = held_out(range(count), HELD_OUT_EVERY)
    if not held:
        fitting, held = fitting[:-1], fitting[-1:]
    return fitting, held


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
        recorder = TopTwoRecorder()
        session.run(encoded[index], observe=recorder, seed=seed + call)
        call += 1
        room = positions - len(sample)
        z1, z2 = (values[:room] for values in recorder.values())
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


# --------------------------------------------------------------------------- one run
StartPass = Callable[[str, int], Callable[[int], None]]  # (stage, positions) -> advance(positions done)


def default_destination(target: str) -> Path:
    """Where a profile goes without --out: the user profile directory, named after the target."""
    return user_profile_dir() / f"{Path(target).name.removesuffix('.gguf')}.yaml"


@dataclass(frozen=True)
class CalibrationRequest:
    """What a calibration is asked for (the calibrate flags); the profile goes to `destination`."""

    destination: Path
    prompts: Path | None = None  # JSONL prompt set; None: the built-in one
    temperature: float = 1.0
    samples: int = 1500
    held_out_samples: int | None = None  # None: a third of `samples`
    max_new_tokens: int = 64
    objective: str = DEFAULT_OBJECTIVE
    seed: int = 0
    resume: bool = False  # continue from the partial file beside `destination`

    @property
    def goal(self) -> Objective:
        return parse_objective(self.objective)

    @property
    def held(self) -> int:
        """Positions sampled from held-out prompts."""
        return self.samples // 3 if self.held_out_samples is None else self.held_out_samples

    @property
    def partial(self) -> Path:
        """The positions sampled so far, kept while sampling so that --resume can continue."""
        return self.destination.with_name(self.destination.name + ".partial.json")

    def validate(self) -> None:
        """One sentence per bad value, before anything is read or loaded."""
        parse_objective(self.objective)
        check_seed(self.seed)
        require(self.samples >= 50, f"--samples must be at least 50, got {self.samples}")
        require(self.held >= 10, f"--held-out-samples must be at least 10, got {self.held}")


class Calibration:
    """One calibrate run of a validated request. Making it reads the prompts; `load` reads the
    partial file (with --resume) and loads the target, so bad input fails before any progress
    bar; `run` samples and writes the profile."""

    def __init__(self, options: DecodingOptions, request: CalibrationRequest) -> None:
        self.request = request
        # calibration samples with its own temperature, seed and length (they are recorded in the profile)
        self.options = options.replace(temperature=request.temperature, seed=request.seed,
                                       max_new_tokens=request.max_new_tokens)
        self.prompts, self.prompt_name, self.prompt_hash = load_prompts(request.prompts, BUILTIN_PROMPTS)
        self.signature = {"target": self.options.model.target, "prompts": self.prompt_hash,
                          "temperature": request.temperature, "samples": request.samples, "held": request.held,
                          "max_new_tokens": request.max_new_tokens, "seed": request.seed}
        self.fit_sample: MarginSample = MarginSample()
        self.held_sample: MarginSample | None = None
        self.session = None

    def load(self) -> None:
        """The positions of an interrupted run (with --resume), then the target."""
        from .session import Session

        if self.request.resume:
            self.fit_sample, self.held_sample = load_partial(self.request.partial, self.signature)
        self.session = Session(self.options)
        self.session.target.fingerprint  # computed now: a model that cannot be fingerprinted fails before sampling

    def run(self, command: str, start_pass: StartPass) -> tuple[dict, Path]:
        """Sample the fitting and held-out passes (checkpointed to the partial file after every
        continuation), build the profile, write it and drop the partial file: (profile, path)."""
        request, partial, signature = self.request, self.request.partial, self.signature
        if self.session is None:
            self.load()
        fit_ids, held_ids = split_prompts(len(self.prompts))
        self.fit_sample = collect(self.session, self.prompts, fit_ids, request.samples, request.seed,
                                  start_pass("sampling (fit)", request.samples), self.fit_sample,
                                  lambda s: save_partial(partial, signature, s, None))
        self.held_sample = collect(self.session, self.prompts, held_ids, request.held, request.seed + 100_000,
                                   start_pass("sampling (held out)", request.held), self.held_sample,
                                   lambda s: save_partial(partial, signature, self.fit_sample, s))
        prompt_set = {"name": self.prompt_name, "sha256": self.prompt_hash, "prompts": len(self.prompts)}
        data = build_profile(self.session, self.fit_sample, self.held_sample, request.goal, request.temperature,
                             prompt_set, command, request.seed)
        written = calibration_profiles.save(data, request.destination)
        partial.unlink(missing_ok=True)
        return data, written
