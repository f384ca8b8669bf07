"""`--dtype auto`: the dtype that decodes fastest on this machine, the way the session decodes,
measured, never read off a CPU flag (these small models are bound by the bytes of weights read
per step, which bfloat16 halves whether or not the CPU computes it natively).

The target, loaded in float32, is checked (`check_usable`) and timed in each candidate (float32 and
bfloat16; float16 too on a GPU; q4 on a CPU for a GGUF, weights.quantizable): single-token cached
forwards through the loop's own scorer after a prefill, dtypes interleaved, median per step (`time_steps`), timed once more on a close call. A
session that drafts compares the candidates by the target's milliseconds per emitted token in the
best draft shape each one's cost curve affords (`speculative_cost`): what width costs differs
between dtypes far more than a plain step does. The fastest usable one wins, with float32 kept
unless another is EXACT_PREFERENCE of it; the choice is cached under `<cache>/dtypes/` (choice.py's
protocol), and the float32 model converted in place once (models.cast_parameters).

A GGUF's prior is q4a8 (`prior`): checked and timed first, and the answer of a measurement cut
short once it passed its check, until a timed candidate beats it; a re-measurement cut short
keeps the entry it re-measured (choice.py's `replaces`).

Usable: on the calibration prompts, until they hold CHECK_POSITIONS positions, a candidate's logits
are finite and their argmax agrees with float32's at MIN_AGREEMENT of the positions or more. An
explicit `--dtype float16` on a CPU takes the same check. Provisional (choice.py): a measurement
on a busy machine, one whose steps varied more than MAX_SPREAD times, one cut short (a candidate
whose check did not finish is not used).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..decoding import cost
from ..decoding.acceptance import EARLY_HEAD, DraftAcceptance
from ..errors import KERNEL_FAILURES, UserError, first_line
from ..models import LoadedModel
from . import clock, curve, machine, store
from .choice import MeasuredChoice, Provenance, announced, obtain
from .dtype_candidate import EXACT_PREFERENCE, Candidate, compared, fastest, parse_candidate, prior
from .weights import (EXACT, QUANTIZED, QUANTIZED_A8, QUANTIZED_MODES, NotExact, Weights,  # EXACT: the reference
                      codes_copy, convert, quantizable, torch_dtype)

SCHEMA = 8  # 8: the choice protocol's entries (provisional, measured_at, busy, attempts)
PLAIN, SPECULATIVE = "plain", "speculative"  # how the session decodes: what the choice compares
FOLDER = "dtypes"  # <cache>/dtypes/<hash of the key>.json
# The check: a lower precision flips the argmax only where float32's top two logits nearly tie (on
# smollm2-135m, bfloat16 agreed with float32 at 92-100% of positions per calibration prompt, 95-97%
# over all 48); a dtype whose arithmetic breaks (overflow to inf, NaN, underflow) agrees at few.
# A working dtype refused costs speed only (float32 is chosen, exact): the threshold errs that way.
MIN_AGREEMENT = 0.90
CHECK_POSITIONS = 320  # positions the check reads: a true 95% falls below 90% with odds under 1 in 10,000
CHECK_TOKENS = 64  # each prompt truncated to this many tokens
CALIBRATION_PROMPTS = Path(__file__).parent.parent / "data" / "calibration_prompts.jsonl"
# prefilled before the timed steps: a decoding step's context, as the cost curve's (at 16 tokens
# emulated bfloat16 stepped 3% faster than float32 on this project's Xeon, at 200 4% slower, and
# decoding at 50-300 tokens ran 9% slower in it: the choice must be timed where decoding runs)
PROMPT_TOKENS = curve.CONTEXT_TOKENS
STEPS = 8  # single-token cached forwards per timed block (ms per step: the block's time / STEPS)
REPEATS = 5  # timed blocks per dtype, interleaved across dtypes; the median counts
MAX_SPREAD = 2.0  # a dtype's slowest block over its fastest beyond this: the machine is not steady
BUDGET_S = 10.0  # at most this long, within the process's budget (clock.BUDGET)
UNCHECKED = "its usability check did not finish within the measuring budget"


def candidates(device: torch.device, quantizable: bool = False) -> tuple[str, ...]:
    """The dtypes `auto` chooses from: float32 and bfloat16; float16 too off the CPU (a CPU's float16
    matrix kernels are seldom its fastest, and its range is float16's risk); q4 on a CPU for a model
    read from a GGUF file where the q4 kernel is built (`quantizable`): its codes give float32's
    numbers (decoding/quantized.py), so it is checked and timed like the others; and there q4a8,
    the same codes against 8-bit activations, which must pass the same check as bfloat16."""
    if device.type != "cpu":
        return (EXACT, "bfloat16", "float16")
    return (EXACT, "bfloat16", QUANTIZED, QUANTIZED_A8) if quantizable else (EXACT, "bfloat16")


def dtype_key(model_fingerprint: str, device: torch.device, speculative: bool = False, packed: bool = False,
              quantizable: bool = False) -> dict:
    """Everything the choice depends on that can change between runs on one machine (`packed`:
    each CPU candidate timed on packed linears, as a session with `--packed-weights` other than off runs it;
    a drafting session's: the acceptance figures it is estimated at, so a new head re-measures)."""
    key = {**machine.machine_key(model_fingerprint, device), "candidates": list(candidates(device, quantizable)),
           "decoding": SPECULATIVE if speculative else PLAIN, "packed": packed}
    if speculative:
        key["acceptance"] = default_acceptance(model_fingerprint).key()
    if quantizable:
        from ..decoding import kernels

        key["kernels"] = kernels.version()  # the quantized modes' speed is the kernels'
    return key


def default_acceptance(model_fingerprint: str) -> DraftAcceptance:
    """The figures of the drafter `--draft auto` takes for this target: its head's measured ones
    when it records them, an early head's otherwise (decoding/acceptance.py)."""
    from ..head.drafter import find_head, head_acceptance

    path = find_head(model_fingerprint)
    figures = None if path is None else head_acceptance(path)
    return figures if figures is not None else EARLY_HEAD


@dataclass
class DtypeChoice:
    """What `--dtype auto` chose, and the measurement it chose from."""

    key: dict
    chosen: str
    candidates: list[Candidate] = field(default_factory=list)
    provenance: Provenance = field(default_factory=Provenance)

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.chosen)

    def fields(self) -> dict:
        return {"chosen": self.chosen, "candidates": [asdict(c) for c in self.candidates]}

    def report(self) -> dict:
        """For `mars tune` and `mars profile --dtypes` (their tables and --json)."""
        return {"key": self.key, "chosen": self.chosen, "cached": self.provenance.cached,
                "provisional": self.provenance.provisional, "path": str(store.cache_path(self.key, FOLDER)),
                "steps": STEPS, "min_agreement": MIN_AGREEMENT, "exact_kept_over": exact_kept(self),
                "exact_preference": EXACT_PREFERENCE, "candidates": [asdict(c) for c in self.candidates]}


def exact_kept(choice: DtypeChoice) -> str | None:
    """The usable dtype that stepped faster than float32 but not by enough to be chosen, if any."""
    if choice.chosen != EXACT:
        return None
    timed = compared(choice.candidates)
    faster = [name for name in timed if name != EXACT and EXACT in timed and timed[name] < timed[EXACT]]
    return min(faster, key=timed.__getitem__) if faster else None


# --------------------------------------------------------------------------- the protocol
class DtypeMeasurement(MeasuredChoice[DtypeChoice]):
    """`--dtype auto` on `target` (loaded in float32, left in float32 here), for a session that
    drafts (`speculative`) or not, each candidate timed on packed linears (`packed`) where they
    can be packed."""

    what, folder, schema, budget_s, label = "dtype measurement", FOLDER, SCHEMA, BUDGET_S, "dtype"

    def __init__(self, target: LoadedModel, speculative: bool = False, packed: bool = False) -> None:
        self.target = target
        self.key = dtype_key(target.fingerprint, target.device, speculative, packed, quantizable(target))

    def measure(self, deadline: float | None, previous: DtypeChoice | None = None) -> DtypeChoice:
        return measure(self.target, self.key, deadline, previous)

    def parse(self, data: dict) -> DtypeChoice | None:
        """Every candidate named once with its fields, a plausible step time for each usable one,
        and the chosen one the fastest of them."""
        found = [parse_candidate(entry) for entry in data["candidates"]]
        names = [c.dtype for c in found if c is not None]
        if sorted(names) != sorted(self.key["candidates"]) or not all(found):
            return None
        choice = DtypeChoice(self.key, str(data["chosen"]), found)  # type: ignore[arg-type]
        usable = [c for c in found if c.usable]  # type: ignore[union-attr]
        if choice.chosen not in names or not any(c.dtype == EXACT for c in usable) or fastest(found, prior(self.key)) != choice.chosen:
            return None
        return choice

    def fallback(self, why: str) -> DtypeChoice:
        return DtypeChoice(self.key, EXACT, [Candidate(EXACT, True, 1.0)], Provenance(provisional=why))

    def replaces(self, result: DtypeChoice, previous: DtypeChoice) -> bool:
        """A complete measurement, or one cut short that timed both its own choice and the previous
        one in this run (then it weighed them side by side); never one that did not reach the
        previous choice (a budget-starved run once put a settled q4a8 back on float32)."""
        if result.provenance.provisional is None:
            return True
        timed = compared(result.candidates)
        return result.chosen in timed and previous.chosen in timed

    def describe(self, result: DtypeChoice) -> str:
        return describe(result)

    def shown(self, result: DtypeChoice) -> str:
        return result.chosen


# --------------------------------------------------------------------------- choosing
def choose(target: LoadedModel, *, fresh: bool = False, speculative: bool = False, packed: bool = False,
           budget: clock.Budget | None = None) -> DtypeChoice:
    """The dtype `--dtype auto` decodes `target` in: the cached choice, else measured (choice.py's
    `obtain`), with one note. `fresh` measures afresh and says nothing (`mars tune`'s table does)."""
    measurement = DtypeMeasurement(target, speculative, packed)
    left_out(target, measurement.key)
    return obtain(measurement, fresh=fresh, budget=budget, announce=not fresh)


def left_out(target: LoadedModel, key: dict) -> None:
    """Say (in `--json`'s `tuning.notes`; a note outside a session) why q4 and q4a8 are no
    candidates for a GGUF target on a CPU whose kernel library is there but unusable (truncated,
    not the kernel): `auto` falls back to the dense dtypes, never builds (a minute) or stops."""
    from ..decoding import kernels
    from . import summary

    if QUANTIZED in key["candidates"] or target.device.type != "cpu" or target.converted_copies is None:
        return
    why = kernels.damage()
    if why is not None:
        detail = f"--dtype auto left out q4 and q4a8: {why} (`python -m mars_cli.decoding.kernels` rebuilds it)"
        summary.announce(summary.Record("dtype", None, detail, None, store.cache_path(key, FOLDER), False), once=True)


def measure(target: LoadedModel, key: dict, deadline: float | None = None,
            previous: DtypeChoice | None = None) -> DtypeChoice:
    """Check and time each candidate on `target` (loaded in float32; left in float32), stopping by
    `deadline` (clock.now(); None: unbounded). `previous`: an entry whose checks and steps were
    complete on a quiet machine, only its cost curves cut short: those go on, the rest is kept."""
    from ..decoding.packing import Switch

    first = prior(key)  # checked and timed first: what a run cut short most needs to know
    names = sorted(key["candidates"], key=lambda name: (name != EXACT, name != first))
    switch = Switch(target.model) if key.get("packed") else None
    packed: set[str] = set()  # the candidates that ran on packed linears

    def use(name: str) -> None:
        """The weights in dtype `name`, on packed linears where asked for and possible (switched,
        not packed again, from the second time on)."""
        weights.use(name)
        if switch is not None and switch.set(True):
            packed.add(name)

    with Weights(target.model, codes_copy(target)) as weights:
        try:
            found, partial = _measured(target, key, use, names, deadline, _resumable(previous))
        finally:
            if switch is not None:
                switch.set(False)
    for candidate in found:
        candidate.packed = candidate.dtype in packed
    timed = [c for c in found if c.ms_per_step is not None]
    unsteady = [c.dtype for c in timed if c.spread > MAX_SPREAD]
    short = [c.dtype for c in found if c.repeats < REPEATS and (c.usable or c.problem == UNCHECKED)]
    provisional = None
    if unsteady:
        provisional = f"{' and '.join(unsteady)} steps varied more than {MAX_SPREAD:g}x between repeats: a busy machine"
    elif short:
        provisional = f"the measuring ran out of its budget before timing {' and '.join(short)} fully"
    elif partial:  # an estimate on some widths only may prefer chains a full curve would not
        provisional = f"the measuring ran out of its budget before the cost curves of {' and '.join(partial)}"
    return DtypeChoice(key, fastest(found, prior(key)), found, Provenance(provisional=provisional))


def _resumable(previous: DtypeChoice | None) -> list[Candidate] | None:
    """`previous`'s candidates when its checks and steps may stand (quiet, steady, complete), so
    that a measurement cut short in its cost curves goes on from there; else None."""
    if previous is None or not previous.provenance.reusable:
        return None
    done = all(c.problem != UNCHECKED and (not c.usable or c.repeats >= REPEATS) and (c.spread or 0) <= MAX_SPREAD
               for c in previous.candidates)
    return [dataclasses.replace(c, ms_per_token=None, shape=None) for c in previous.candidates] if done else None


def _measured(target: LoadedModel, key: dict, use: Callable[[str], None], names: Sequence[str],
              deadline: float | None, kept: list[Candidate] | None = None) -> tuple[list[Candidate], list[str]]:
    """Each candidate checked, timed and (a speculative session) estimated, with `use` switching,
    all by `deadline` (`kept`: checked and timed already); and the candidates whose estimate stood
    on a curve cut short."""
    found = kept if kept is not None else _checked_and_timed(target, use, names, deadline)
    partial = []
    if key.get("decoding") == SPECULATIVE:  # the fastest step's curve first: the likeliest choice's
        for candidate in sorted(found, key=lambda c: c.ms_per_step or math.inf):
            if candidate.ms_per_step is not None:
                use(candidate.dtype)  # its curve is measured as the session would run it
                candidate.ms_per_token, candidate.shape, complete, candidate.curve = speculative_cost(
                    target, candidate.dtype, candidate.ms_per_step, fresh=deadline is None)
                partial += [] if complete else [candidate.dtype]
    return found, partial


def _checked_and_timed(target: LoadedModel, use: Callable[[str], None], names: Sequence[str],
                       deadline: float | None) -> list[Candidate]:
    found = check_usable(target, use, names, deadline)
    usable = [c.dtype for c in found if c.usable]
    samples = time_steps(target, use, usable, deadline)
    if _close_call(samples) and (deadline is None or clock.now() < deadline):  # timed again, the blocks pooled
        samples = clock.pooled(samples, time_steps(target, use, usable, deadline))
    for candidate in found:
        times = samples.get(candidate.dtype) or []
        if times:
            candidate.ms_per_step = statistics.median(times)
            candidate.spread = max(times) / min(times) if min(times) > 0 else math.inf
            candidate.repeats = len(times)
    return found


def _close_call(samples: dict[str, list[float]]) -> bool:
    """Whether a lower precision's median step lies within clock.CLOSE_CALL of EXACT_PREFERENCE of
    float32's: a verdict that one slow minute could turn."""
    medians = {name: statistics.median(times) for name, times in samples.items() if times}
    exact = medians.get(EXACT)
    return bool(exact) and any(clock.close_call(ms / exact, EXACT_PREFERENCE)
                               for name, ms in medians.items() if name != EXACT)


def describe(choice: DtypeChoice) -> str:
    """The one line a measured choice is announced with."""
    timed = sorted((c for c in choice.candidates if c.ms_per_step is not None),
                   key=lambda c: c.dtype != choice.chosen)
    steps = ", ".join(f"{c.ms_per_step:.1f} ms in {_label(c)}" for c in timed)
    estimated = ", ".join(f"{c.ms_per_token:.1f} ms in {_label(c)} with {c.shape}"
                          for c in timed if c.ms_per_token is not None)
    if estimated:
        line = (f"--dtype auto for speculative decoding: {choice.chosen} (target forwards per token, estimated from "
                f"the cost curves: {estimated}; a plain step took {steps})")
    else:
        line = f"--dtype auto: {choice.chosen}" + (f" (a plain decoding step took {steps})" if steps else "")
    if any(c.repeats > REPEATS for c in choice.candidates):
        line += "; timed twice: a close call"
    kept = exact_kept(choice)
    if kept:
        line += f"; float32 kept, exact: {kept} was not {1 - EXACT_PREFERENCE:.0%} faster"
    refused = [f"{c.dtype} not usable here: {c.problem}" for c in choice.candidates if not c.usable]
    if refused:
        line += "; " + "; ".join(refused)
    return announced(line, choice.provenance, "model, device and torch version (`mars tune` shows it; --dtype "
                                              "float32 is the exact mode)")


def _label(candidate: Candidate) -> str:
    return candidate.dtype + (" (packed linears)" if candidate.packed else "")


def speculative_cost(target: LoadedModel, name: str, plain_ms: float,
                     fresh: bool = False) -> tuple[float | None, str | None, bool, dict[str, float] | None]:
    """(the target's milliseconds per emitted token, the shape) in dtype `name`, whose weights
    `target` holds now, from its cost curve (the cached one, or measured now within what is left
    of the budget and cached, as a session's own; `fresh`: measured afresh) taken relative to its
    own width-1 cost and scaled by `plain_ms`, the step timed interleaved with the other dtypes'
    (curves measured one after the other would carry the machine's drift between them), whether
    the curve held every width the estimate reads, and the curve relative to width 1 (what
    `mars profile --dtypes` draws side by side); (None, None, False, None) without one."""
    from ..decoding.target import TargetScorer

    loaded_as, linears = target.dtype, target.linears
    target.dtype = torch_dtype(name)  # the curve's key, and the attention masks' dtype
    target.linears = name if name in QUANTIZED_MODES else "dense"  # the curve's key too
    try:
        found = curve.measured_curve(TargetScorer(target), cost.ESTIMATE_WIDTHS, fresh=fresh, announce=False)
    finally:
        target.dtype, target.linears = loaded_as, linears
    measured, stand_in = found.curve, found.provenance.stale  # a stand-in's widths are no measurement
    if 1 not in measured.ms_by_width or stand_in:
        return None, None, False, None
    ms, shape = cost.speculative_estimate(measured, default_acceptance(target.fingerprint))
    complete = found.provenance.provisional is None and all(w in measured.ms_by_width for w in cost.ESTIMATE_WIDTHS)
    base = measured.ms_by_width[1]
    relative = {str(width): round(ms_width / base, 3) for width, ms_width in sorted(measured.ms_by_width.items())}
    return plain_ms * ms / base, shape, complete, relative


# --------------------------------------------------------------------------- the check
def check_usable(target: LoadedModel, use: Callable[[str], None], names: Sequence[str],
                 deadline: float | None = None) -> list[Candidate]:
    """Each candidate's verdict: its next-token logits at every position of the check's prompts
    finite, and their argmax equal to float32's at MIN_AGREEMENT of the positions or more. A
    dtype torch cannot run here is not usable either, nor one whose check `deadline` cut short
    (UNCHECKED). float32, the reference, always is."""
    prompts = check_prompts(target)
    reference = _argmaxes(target, use, EXACT, prompts, deadline)
    found = []
    for name in names:
        if name == EXACT:
            found.append(Candidate(name, True, 1.0))
            continue
        try:
            checked = None if reference is None else _argmaxes(target, use, name, prompts, deadline)
        except NotExact as exc:
            found.append(Candidate(name, False, problem=str(exc)))
            continue
        except KERNEL_FAILURES as exc:
            found.append(Candidate(name, False, problem=f"torch cannot run it ({first_line(exc)})"))
            continue
        if checked is None:
            found.append(Candidate(name, False, problem=UNCHECKED))
            continue
        chosen, finite = checked
        agreement = float(torch.cat(chosen).eq(torch.cat(reference[0])).float().mean())
        if not finite:
            found.append(Candidate(name, False, agreement, "its logits are not finite (overflow or NaN)"))
        elif agreement < MIN_AGREEMENT:
            found.append(Candidate(name, False, agreement, f"its next tokens agree with float32's at {agreement:.0%} "
                                                           f"of the check's positions (at least {MIN_AGREEMENT:.0%} needed)"))
        else:
            found.append(Candidate(name, True, agreement))
    return found


def check_prompts(target: LoadedModel) -> list[torch.Tensor]:
    """The check's token ids: calibration prompts as plain text, in order, until they hold
    CHECK_POSITIONS positions (all of them when they hold fewer)."""
    texts = [json.loads(line)["prompt"] for line in CALIBRATION_PROMPTS.read_text(encoding="utf-8").splitlines()
             if line.strip()]
    prompts, positions = [], 0
    for text in texts:
        ids = list(target.tokenizer(text)["input_ids"])[:CHECK_TOKENS]
        if ids:
            prompts.append(torch.tensor(ids, dtype=torch.long))
            positions += len(ids)
        if positions >= CHECK_POSITIONS:
            break
    return prompts


def _argmaxes(target: LoadedModel, use: Callable[[str], None], name: str, prompts: Sequence[torch.Tensor],
              deadline: float | None = None) -> tuple[list[torch.Tensor], bool] | None:
    """Each prompt's argmax at every position in dtype `name`, and whether every logit was finite;
    None when `deadline` passed before every prompt was read."""
    use(name)
    chosen, finite = [], True
    with torch.inference_mode():
        for ids in prompts:
            if deadline is not None and clock.now() >= deadline:
                return None
            logits = target.model(input_ids=ids[None].to(target.device), use_cache=False).logits[0]
            finite = finite and bool(torch.isfinite(logits).all())
            chosen.append(logits.argmax(-1).cpu())
    return chosen, finite


def require_usable(target: LoadedModel, name: str, flag: str) -> None:
    """An explicit dtype that needs the check (float16 on a CPU, loaded in float32): UserError
    unless it passes; converted to it when it does."""
    with Weights(target.model, codes_copy(target)) as weights:
        verdict = check_usable(target, weights.use, [name])[0]
    if not verdict.usable:
        raise UserError(f"{flag} {name} is unusable on this {target.device.type.upper()}: {verdict.problem}; use "
                        "--dtype auto, float32 or bfloat16")
    convert(target, name)


# --------------------------------------------------------------------------- timing
def time_steps(target: LoadedModel, use: Callable[[str], None], names: Sequence[str],
               deadline: float | None = None) -> dict[str, list[float]]:
    """Milliseconds per plain decoding step in each dtype of `names`, one value per timed block:
    per dtype, PROMPT_TOKENS pseudo-random tokens prefilled and one step taken (untimed, the
    warm-up), then blocks of STEPS single-token cached forwards through the loop's scorer (each
    feeding the last step's greedy token), dtypes interleaved, REPEATS blocks each, stopping at
    `deadline` (clock.time_interleaved)."""
    from ..decoding.target import TargetScorer
    from ..decoding.tree import DraftTree

    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.vocab_size, (PROMPT_TOKENS + 1,), generator=generator)
    nothing = DraftTree.chain(prompt[:0])
    scorers: dict[str, TargetScorer] = {}
    pending: dict[str, torch.Tensor] = {}

    def step(name: str) -> None:
        scored = scorers[name].score(pending[name], nothing, width=1)
        scorers[name].keep([0])
        pending[name] = scored.logits[-1].argmax().view(1).cpu()

    def run(name: str) -> None:
        use(name)
        if name not in scorers:  # the warm-up: a fresh sequence, then one step
            scorers[name] = TargetScorer(target)
            scorers[name].start(prompt[:PROMPT_TOKENS])
            pending[name] = prompt[PROMPT_TOKENS:]
            step(name)
            return
        for _ in range(STEPS):
            step(name)

    device = target.device
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        blocks = clock.time_interleaved(run, list(names), REPEATS, synchronize, deadline)
    return {name: [ms / STEPS for ms in times] for name, times in blocks.items()}
