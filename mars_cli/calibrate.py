"""Sampled logits -> per-model MARS thresholds, per decoding mode.

The target continues a prompt set through the ordinary decoding loop, once per mode: greedily
(the greedy mode, T = 0: the positions greedy decoding visits) and by sampling at --temperature
(the sampled mode); at every generated position we keep its two largest raw logits (z1, z2).
From them each margin measure gets a threshold that meets an objective:

- `rate=R`: a share R of positions is low-margin (eligible for relaxation);
- `loss=L`: if every eligible position took its runner-up, the target's log-probability given up
  per token, mean over all positions of [eligible] * (z1 - z2) at T = 1, is at most L nats.
  It is an upper bound on MARS's cost: only positions where the drafter proposed the runner-up
  are actually relaxed.
- `quality=DROP`: measured instead of bounded, in mars_cli/calibration_sweep.py: the most
  permissive theta whose task metrics and mean log-probability stay within DROP of strict.

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
from . import calibration_sweep as sweeping
from .calibration_profiles import MODES
from .decoding.rules import MARGIN_MEASURES, margin
from .decoding.verifiers import TopTwoRecorder
from .errors import UserError, check_seed, require
from .paths import user_profile_dir, write_atomic
from .prompts import held_out, load_prompts

if TYPE_CHECKING:
    from .options import DecodingOptions

BUILTIN_PROMPTS = Path(__file__).parent / "data" / "calibration_prompts.jsonl"
DEFAULT_OBJECTIVE = "loss=0.05"
LOSS_BESIDE = 0.05  # the loss bound reported beside every quality fit, nats/token
PAPER_THETA = 0.9
QUANTILES = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
HELD_OUT_EVERY = 4


# --------------------------------------------------------------------------- objectives
@dataclass(frozen=True)
class Objective:
    kind: str  # "rate", "loss" or "quality"
    value: float

    def __str__(self) -> str:
        return f"{self.kind}={self.value:g}"


def parse_objective(text: str) -> Objective:
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


def collect_greedy(session, prompts: list[str], indices: list[int], positions: int,
                   advance: Callable[[int], None]) -> MarginSample:
    """The greedy path of each prompt in `indices`, once (a greedy continuation never changes),
    until `positions` positions are collected or the prompts run out."""
    sample = MarginSample()
    for index in indices:
        if len(sample) >= positions:
            break
        recorder = TopTwoRecorder()
        session.run(session.encode(prompts[index]), observe=recorder)
        z1, z2 = (values[:positions - len(sample)] for values in recorder.values())
        sample.add(z1, z2)
        advance(z1.numel())
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


def to_raw(theta: float, measure: str, temperature: float) -> float:
    """A prob-ratio theta applied at temperature T is theta ** T on the raw (T = 1) scale that
    profiles hold (the inverse of calibration_profiles.threshold_at_temperature)."""
    if measure == "prob-ratio" and temperature > 0:
        return theta ** temperature
    return theta


def quality_block(run: sweeping.ModeRun, drop: float, measure: str, temperature: float, drafter: str,
                  max_new_tokens: int, seed: int) -> dict:
    """One mode fitted to the quality objective: the chosen theta (1.0, nothing relaxed, when no
    swept theta held quality), its interval, the sweep, and beside it the loss bound fitted on
    the positions strict visited in this mode."""
    sample = MarginSample()
    for a, b in zip(run.z1, run.z2):
        sample.add(torch.tensor(a, dtype=torch.float32), torch.tensor(b, dtype=torch.float32))
    z1, z2 = sample.positions()
    gaps = z1 - z2
    sweep = sweeping.sweep_block(run, drop, measure, seed)
    chosen = to_raw(sweep["chosen"] if sweep["chosen"] is not None else 1.0, measure, temperature)
    bound = Objective("loss", LOSS_BESIDE)
    return {
        "temperature": temperature,
        "thresholds": {measure: round(chosen, 6)},
        "objective": {"kind": "quality", "value": drop},
        "positions": len(sample),
        "threshold_interval_90": {measure: [round(to_raw(v, measure, temperature), 6)
                                            for v in sweep["chosen_interval_90"]]},
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


LEGACY_KEYS = ("threshold_interval_90", "held_out", "at_paper_theta_0.9", "top1_logit_nonpositive_share")


def assemble(session, modes: dict[str, dict], objective: Objective, prompt_set: dict, command: str) -> dict:
    """The profile: per-mode blocks under `modes`; at the top level the fields every profile has
    always had, from the sampled mode (the greedy one when there is no sampled mode), so older
    readers of the file still find sampled thresholds where they were."""
    primary = modes.get("sampled") or modes["greedy"]
    target = session.target
    data = {
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
        **{key: primary[key] for key in LEGACY_KEYS if key in primary},
        "modes": modes,
        "tool_version": __version__,
        "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
    }
    return data


# --------------------------------------------------------------------------- one run
StartPass = Callable[[str, int], Callable[[int], None]]  # (stage, positions) -> advance(positions done)


def default_destination(target: str) -> Path:
    """Where a profile goes without --out: the user profile directory, named after the target."""
    return user_profile_dir() / f"{Path(target).name.removesuffix('.gguf')}.yaml"


def parse_modes(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in MODES]
    require(bool(names) and not unknown, f"--modes {text!r}: expected greedy, sampled or greedy,sampled")
    return names


@dataclass(frozen=True)
class CalibrationRequest:
    """What a calibration is asked for (the calibrate flags); the profile goes to `destination`."""

    destination: Path
    prompts: Path | None = None  # JSONL prompt set; None: the built-in one
    temperature: float = 1.0  # the sampled mode's
    samples: int = 1500
    held_out_samples: int | None = None  # None: a third of `samples`
    max_new_tokens: int | None = None  # None: 64 for rate/loss, 48 for a quality sweep
    objective: str = DEFAULT_OBJECTIVE
    seed: int = 0
    resume: bool = False  # continue from the partial file beside `destination`
    modes: str = "greedy,sampled"
    suite: str = sweeping.DEFAULT_SUITES  # quality= only, as are the fields below
    limit: int = sweeping.DEFAULT_LIMIT
    thetas: str | None = None  # None: sweeping.DEFAULT_THETAS for the measure
    allow_code_execution: bool = False
    weak_sandbox: bool = False

    @property
    def goal(self) -> Objective:
        return parse_objective(self.objective)

    @property
    def quality(self) -> bool:
        return self.goal.kind == "quality"

    @property
    def mode_list(self) -> tuple[str, ...]:
        return parse_modes(self.modes)

    @property
    def length(self) -> int:
        """New tokens per continuation (or per suite sample)."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return sweeping.DEFAULT_LENGTH if self.quality else 64

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
        modes = self.mode_list
        require(math.isfinite(self.temperature) and self.temperature >= 0,
                f"--temperature must be a finite number >= 0, got {self.temperature}")
        require(self.temperature > 0 or "sampled" not in modes,
                "--temperature 0 is greedy decoding: the sampled mode needs --temperature > 0 (or --modes greedy)")
        require(self.length >= 1, f"--max-new-tokens must be at least 1, got {self.length}")
        require(self.samples >= 50, f"--samples must be at least 50, got {self.samples}")
        require(self.held >= 10, f"--held-out-samples must be at least 10, got {self.held}")
        if self.quality:
            require(not self.resume, "--resume continues the sampling of a rate= or loss= calibration; "
                                     "a quality= sweep starts afresh")
            require(self.limit >= 1, f"--limit must be at least 1, got {self.limit}")
            if self.thetas is not None:
                sweeping.parse_thetas(self.thetas)


class Calibration:
    """One calibrate run of a validated request. Making it reads the prompts (or a quality
    sweep's suites); `load` reads the partial file (with --resume) and loads the target, so bad
    input fails before any progress bar; `run` samples (or sweeps) and writes the profile."""

    def __init__(self, options: DecodingOptions, request: CalibrationRequest) -> None:
        self.request = request
        self.drafter = options.drafting.draft  # the quality sweep's; sampling passes decode plainly
        self.measure = options.verification.margin
        self.base = options
        # calibration samples with its own temperature, seed and length (they are recorded in the profile)
        self.options = options.replace(temperature=request.temperature, seed=request.seed, draft="none",
                                       verify="strict", max_new_tokens=request.length)
        self.suites: list = []
        self.strict_sandbox = True
        if request.quality:
            self.suites = sweeping.quality_suites(request.suite, request.limit, request.allow_code_execution)
            self.thetas = (sweeping.parse_thetas(request.thetas) if request.thetas is not None
                           else sweeping.DEFAULT_THETAS[self.measure])
            self.prompt_name, self.prompt_hash = request.suite, _suite_hash(self.suites)
            self.prompts: list[str] = [s.turns[0] for suite in self.suites for s in suite.samples]
            if request.allow_code_execution and any(suite.needs_execution for suite in self.suites):
                from .evaluation.execution import sandbox_mode

                self.strict_sandbox = sandbox_mode(request.weak_sandbox)  # refuses before any model loads
        else:
            self.prompts, self.prompt_name, self.prompt_hash = load_prompts(request.prompts, BUILTIN_PROMPTS)
        self.signature = {"target": self.options.model.target, "prompts": self.prompt_hash,
                          "temperature": request.temperature, "samples": request.samples, "held": request.held,
                          "max_new_tokens": request.length, "seed": request.seed}
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

    def run(self, command: str, start_pass: StartPass, note: Callable[[str], None] = lambda _: None) -> tuple[dict, Path]:
        """Fit every requested mode, build the profile, write it (and drop the partial file):
        (profile, path). `note` receives one-line remarks (the drafter a sweep falls back to)."""
        request = self.request
        if self.session is None:
            self.load()
        modes = self._quality_modes(start_pass, note) if request.quality else self._bound_modes(start_pass)
        prompt_set = {"name": self.prompt_name, "sha256": self.prompt_hash, "prompts": len(self.prompts)}
        data = assemble(self.session, modes, request.goal, prompt_set, command)
        written = calibration_profiles.save(data, request.destination)
        request.partial.unlink(missing_ok=True)
        return data, written

    def _bound_modes(self, start_pass: StartPass) -> dict[str, dict]:
        """rate= / loss=: the sampling passes (checkpointed to the partial file after every
        continuation, so they come first), then the greedy paths of the prompts (deterministic:
        a resumed run simply decodes them again)."""
        from .session import Session

        request, partial, signature = self.request, self.request.partial, self.signature
        fit_ids, held_ids = split_prompts(len(self.prompts))
        modes = {}
        if "sampled" in request.mode_list:
            self.fit_sample = collect(self.session, self.prompts, fit_ids, request.samples, request.seed,
                                      start_pass("sampling (fit)", request.samples), self.fit_sample,
                                      lambda s: save_partial(partial, signature, s, None))
            self.held_sample = collect(self.session, self.prompts, held_ids, request.held, request.seed + 100_000,
                                       start_pass("sampling (held out)", request.held), self.held_sample,
                                       lambda s: save_partial(partial, signature, self.fit_sample, s))
            modes["sampled"] = fit_block(self.fit_sample, self.held_sample, request.goal, request.temperature,
                                         request.seed)
        if "greedy" in request.mode_list:
            greedy = Session(self.options.replace(temperature=0.0), target=self.session.target)
            fit_sample = collect_greedy(greedy, self.prompts, fit_ids, request.samples,
                                        start_pass("greedy paths (fit)", request.samples))
            held_sample = collect_greedy(greedy, self.prompts, held_ids, request.held,
                                         start_pass("greedy paths (held out)", request.held))
            modes["greedy"] = fit_block(fit_sample, held_sample, request.goal, 0.0, request.seed)
        return modes

    def _quality_modes(self, start_pass: StartPass, note: Callable[[str], None]) -> dict[str, dict]:
        """quality=: per mode, strict once and MARS at every theta over the suites, on the loaded
        target and one drafter."""
        from .session import Session

        request = self.request
        target = self.session.target
        drafter = sweeping.resolve_drafter(self.drafter, target, note)
        modes, draft_model = {}, None
        total = sum(len(suite.samples) for suite in self.suites) * (len(self.thetas) + 1)
        for mode in request.mode_list:
            temperature = 0.0 if mode == "greedy" else request.temperature
            # a chain (--draft-topk 1): the sweep must not depend on this machine's tree shape
            options = self.base.replace(draft=drafter, draft_topk=1, verify="mars", threshold=self.thetas[0],
                                        margin=self.measure, temperature=temperature, seed=request.seed, max_new_tokens=request.length)
            session = Session(options, target=target, draft_model=draft_model)
            draft_model = session.draft_model
            run = sweeping.run_mode(session, self.suites, self.thetas, self.measure, request.allow_code_execution,
                                    self.strict_sandbox, start_pass(f"sweep ({mode})", total))
            modes[mode] = quality_block(run, request.goal.value, self.measure, temperature, drafter,
                                        request.length, request.seed)
        return modes


def _suite_hash(suites: list) -> str:
    """sha256 of the samples swept (ids, turns and references), so a profile names its evidence."""
    import hashlib

    payload = [[suite.name, suite.metric, [[s.id, s.turns, s.reference] for s in suite.samples]] for suite in suites]
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
