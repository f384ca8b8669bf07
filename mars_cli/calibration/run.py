"""`mars calibrate`, one run: the request (the calibrate flags, validated), then the prompts or
suites, the target, the collection (rate= / loss=) or the sweep (quality=) per decoding mode,
and the written profile.

The target continues a prompt set through the ordinary decoding loop, once per mode: greedily
(the greedy mode, T = 0: the positions greedy decoding visits) and by sampling at --temperature
(the sampled mode); collection.py keeps the top-two raw logits of every generated position and
objectives.py fits each margin measure's threshold to the objective. A quality= objective
measures instead (sweep.py). `CalibrationRequest` and `Calibration` hold the command's steps so
that the CLI only parses flags, shows progress and renders the profile.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..decoding.sampling import GREEDY_BELOW, SamplingParams
from ..errors import check_seed, require
from ..paths import user_profile_dir
from ..prompts import load_prompts
from . import profiles, sweep
from .collection import MarginSample, collect, collect_greedy, load_partial, save_partial, split_prompts
from .fitting import assemble, fit_block, quality_block
from .objectives import DEFAULT_OBJECTIVE, Objective, parse_objective
from .profiles import MODES

if TYPE_CHECKING:
    from ..evaluation.suites import Suite
    from ..options import DecodingOptions
    from ..session import Session

BUILTIN_PROMPTS = Path(__file__).parent.parent / "data" / "calibration_prompts.jsonl"

StartPass = Callable[[str, int], Callable[[int], None]]  # (stage, positions) -> advance(positions done)


def default_destination(target: str) -> Path:
    """Where a profile goes without --out: the user profile directory, named after the target."""
    return user_profile_dir() / f"{Path(target).name.removesuffix('.gguf')}.yaml"


def parse_modes(text: str) -> tuple[str, ...]:
    """`greedy`, `sampled` or both, comma-separated, each once in the order given."""
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
    suite: str = sweep.DEFAULT_SUITES  # quality= only, as are the fields below
    limit: int | str = sweep.DEFAULT_LIMIT  # samples per suite, or "auto" (sweep.parse_limit)
    thetas: str | None = None  # None: sweep.DEFAULT_THETAS for the measure
    allow_code_execution: bool = False
    weak_sandbox: bool = False

    def __post_init__(self) -> None:  # `--limit` arrives as text: a number or auto, refused in one line otherwise
        object.__setattr__(self, "limit", sweep.parse_limit(self.limit))

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
        return sweep.DEFAULT_LENGTH if self.quality else 64

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
        require(not SamplingParams(self.temperature).greedy or "sampled" not in modes,
                f"--temperature {self.temperature:g} is greedy decoding: the sampled mode needs --temperature "
                f">= {GREEDY_BELOW:g} (or --modes greedy)")
        require(self.length >= 1, f"--max-new-tokens must be at least 1, got {self.length}")
        require(self.samples >= 50, f"--samples must be at least 50, got {self.samples}")
        require(self.held >= 10, f"--held-out-samples must be at least 10, got {self.held}")
        if self.quality:
            require(not self.resume, "--resume continues the sampling of a rate= or loss= calibration; "
                                     "a quality= sweep starts afresh")
            if self.thetas is not None:
                sweep.parse_thetas(self.thetas)


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
        self.suites: list[Suite] = []
        self.strict_sandbox = True
        if request.quality:
            sweep.check_drafter(self.drafter)
            self.suites = sweep.quality_suites(request.suite, request.limit, request.allow_code_execution)
            self.thetas = (sweep.parse_thetas(request.thetas) if request.thetas is not None
                           else sweep.DEFAULT_THETAS[self.measure])
            self.prompt_name, self.prompt_hash = request.suite, _suite_hash(self.suites)
            self.prompts: list[str] = [s.turns[0] for suite in self.suites for s in suite.samples]
            if request.allow_code_execution and any(suite.needs_execution for suite in self.suites):
                from ..evaluation.execution import sandbox_mode

                self.strict_sandbox = sandbox_mode(request.weak_sandbox)  # refuses before any model loads
        else:
            self.prompts, self.prompt_name, self.prompt_hash = load_prompts(request.prompts, BUILTIN_PROMPTS)
        self.signature = {"target": self.options.model.target, "prompts": self.prompt_hash,
                          "temperature": request.temperature, "samples": request.samples, "held": request.held,
                          "max_new_tokens": request.length, "seed": request.seed}
        self.fit_sample: MarginSample = MarginSample()
        self.held_sample: MarginSample | None = None
        self.session: Session | None = None

    def load(self) -> None:
        """The positions of an interrupted run (with --resume), then the target."""
        from ..session import Session

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
        if request.quality and request.limit == sweep.AUTO:  # the prompt set is what the sweeps decoded
            used = max(block["sweep"]["samples_per_suite"] for block in modes.values())
            swept = sweep.last_samples(self.suites, used)
            self.prompt_hash = _suite_hash(swept)
            self.prompts = [s.turns[0] for suite in swept for s in suite.samples]
        prompt_set = {"name": self.prompt_name, "sha256": self.prompt_hash, "prompts": len(self.prompts)}
        data = assemble(self.session, modes, request.goal, prompt_set, command)
        written = profiles.save(data, request.destination)
        request.partial.unlink(missing_ok=True)
        return data, written

    def _bound_modes(self, start_pass: StartPass) -> dict[str, dict]:
        """rate= / loss=: the sampling passes (checkpointed to the partial file after every
        continuation, so they come first), then the greedy paths of the prompts (deterministic:
        a resumed run simply decodes them again)."""
        from ..session import Session

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
        target and one drafter; with --limit auto, on more samples a suite while the decision is
        unclear (sweep.run_growing)."""
        from ..session import Session

        request = self.request
        target = self.session.target
        drafter = sweep.resolve_drafter(self.drafter, target, note)
        modes, draft_model = {}, None
        total = sum(len(suite.samples) for suite in self.suites) * (len(self.thetas) + 1)
        for mode in request.mode_list:
            temperature = 0.0 if mode == "greedy" else request.temperature
            # a chain (--draft-topk 1): the sweep must not depend on this machine's tree shape
            options = self.base.replace(draft=drafter, draft_topk=1, verify="mars", threshold=self.thetas[0],
                                        margin=self.measure, temperature=temperature, seed=request.seed, max_new_tokens=request.length)
            session = Session(options, target=target, draft_model=draft_model)
            draft_model = session.draft_model
            if request.limit == sweep.AUTO:
                def start_round(size: int, decodings: int, mode: str = mode) -> Callable[[int], None]:
                    return start_pass(f"sweep ({mode}, {size} a suite)", decodings)

                swept = sweep.run_growing(session, self.suites, self.thetas, self.measure, request.goal.value,
                                          request.allow_code_execution, self.strict_sandbox, start_round, request.seed)
            else:
                swept = sweep.run_mode(session, self.suites, self.thetas, self.measure, request.allow_code_execution,
                                       self.strict_sandbox, start_pass(f"sweep ({mode})", total))
            modes[mode] = quality_block(swept, request.goal.value, self.measure, temperature, drafter,
                                        request.length, request.seed)
        return modes


def _suite_hash(suites: list[Suite]) -> str:
    """sha256 of the samples swept (ids, turns and references), so a profile names its evidence."""
    payload = [[suite.name, suite.metric, [[s.id, s.turns, s.reference] for s in suite.samples]] for suite in suites]
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
