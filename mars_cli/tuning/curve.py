"""The target's cost curve on this machine: milliseconds per forward by width, measured through
the session's own scorer, cached per (device, dtype, model, compile mode, packing, threads,
torch) under `<cache>/costs/` (choice.py's protocol).

Only the widths a session reads are measured (`curve_for`), within what is left of the process's
budget; a curve cut short keeps what it measured, provisional, and a later quiet run measures the
rest. A chain-or-tree call closer than cost.SHAPE_CLOSE is timed again once (`settle`). A process
that waited too long for another's measurement decodes with a stand-in (`default_curve`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from .. import notes
from ..decoding.acceptance import DraftAcceptance
from ..decoding import cost
from ..decoding.cost import COMPILED_WIDTHS, DEFAULT_WIDTHS, MAX_TREE_TOKENS, SCHEMA, CostCurve
from ..decoding.packing import installed
from ..decoding.tree import DraftTree
from . import clock, machine, store, summary
from .choice import MeasuredChoice, Provenance, announced, due, obtain, read, save

if TYPE_CHECKING:
    from ..decoding.target import TargetScorer

FOLDER = "costs"
CONTEXT_TOKENS = 200  # cached tokens before the timed forwards (a typical prompt + some output)
FIRST_USE_REPEATS = 3
FRESH_REPEATS = 5
SETTLE_REPEATS = 8  # forwards of each deciding width, interleaved, when a chain-or-tree call is close
# a cached cost outside these is nonsense, measured again (`plausible`)
MIN_WIDTH_RATIO, MAX_WIDTH_RATIO = 0.1, 1000.0
MAX_PLAUSIBLE_WIDTH = 4096
# a wider forward feeds the positions of a narrower one and more: one that costs under this share of
# a narrower width's is noise or a forged entry (a curve falling to width 65 had the default pick a
# 4 x 64 tree that ran 2.3x slower)
MIN_FALL_RATIO = 0.75
# ... and by more than this: a tiny model's forwards (a millisecond or two) jitter by more than a
# quarter without a real curve falling; a real model's that fall do so by tens of milliseconds
MIN_FALL_MS = 2.0
DEFAULT_PLAIN_MS = 50.0  # a stand-in curve's plain forward where nothing was timed (about this project's CPUs')


def curve_key(model_fingerprint: str, device: torch.device, dtype: torch.dtype, compiled: bool,
              context: int = CONTEXT_TOKENS, packed: bool = False, linears: str = "dense") -> dict:
    """Everything the cost depends on that can change between runs on one machine (`packed`: the
    linears run on prepacked weights, decoding/packing.py; `linears`: q4, on their codes,
    decoding/quantized.py)."""
    key = {**machine.machine_key(model_fingerprint, device), "dtype": str(dtype).replace("torch.", ""),
           "compiled": compiled, "context": context, "packed": packed}
    if linears != "dense":  # (dense keys stay as they were: their cached curves stay valid)
        from ..decoding import kernels

        key["linears"] = linears
        key["kernels"] = kernels.version()  # a changed kernel or lean forward costs anew
    return key


def plain_step_ms(target) -> float | None:
    """The plain step `--dtype auto` timed for `target`'s dtype, if it did."""
    choice = getattr(target, "dtype_choice", None)
    name = str(target.dtype).replace("torch.", "")
    return next((c.ms_per_step for c in choice.candidates if c.dtype == name), None) if choice else None


def scorer_key(scorer: "TargetScorer") -> dict:
    target = scorer.target
    engine_key = getattr(scorer, "engine_key", None)  # another engine's scorer (llama.cpp) adds its own terms
    if engine_key is not None:
        return {**curve_key(target.fingerprint, target.device, target.dtype, False, CONTEXT_TOKENS), **engine_key()}
    return curve_key(target.fingerprint, target.device, target.dtype, scorer.compiled, CONTEXT_TOKENS,
                     installed(target.model), getattr(target, "linears", "dense"))


SCOPE = "model, device, dtype and compile mode"  # what one curve is measured for (in its notes)


@dataclass
class MeasuredCurve:
    """A cost curve with where it came from (the protocol's result)."""

    curve: CostCurve
    provenance: Provenance = field(default_factory=Provenance)

    def fields(self) -> dict:
        return self.curve.fields()


class CurveMeasurement(MeasuredChoice[MeasuredCurve]):
    """The curve of `scorer`'s forwards with at least `wanted` widths (`known`: this session's
    curve so far, whose widths are not measured again)."""

    what, folder, schema, label = "cost curve measurement", FOLDER, SCHEMA, "cost curve"

    def __init__(self, scorer: "TargetScorer", wanted: Sequence[int], known: CostCurve | None = None,
                 repeats: int = FIRST_USE_REPEATS) -> None:
        self.scorer, self.wanted, self.known, self.repeats = scorer, sorted(set(wanted) | {1}), known, repeats
        self.key = scorer_key(scorer)
        self.plain_hint = plain_step_ms(scorer.target)
        # a compiled scorer's widths are few, and each one's first forward is a compile that decoding
        # would pay anyway: no budget of its own (one cut short would leave its chain width unmeasured)
        self.budget_s = math.inf if scorer.compiled else None

    def merged(self, curve: CostCurve | None) -> CostCurve:
        """`curve` with this session's known widths on top."""
        have = {**(curve.ms_by_width if curve else {}), **(self.known.ms_by_width if self.known else {})}
        settled = (curve.settled if curve else frozenset()) | (self.known.settled if self.known else frozenset())
        return CostCurve(self.key, have, settled)

    def complete(self, result: MeasuredCurve) -> bool:
        return all(w in self.merged(result.curve).ms_by_width for w in self.wanted)

    def measure(self, deadline: float | None, previous: MeasuredCurve | None = None) -> MeasuredCurve:
        """The widths missing timed; a previous entry's widths are kept and added to when its
        figures may be reused (provenance.reusable), else timed again, the missing ones first, its
        figures standing in (provisional) for those the deadline leaves untimed."""
        reuse = previous is None or previous.provenance.reusable
        have = self.merged(previous.curve if previous and reuse else None)
        missing = [w for w in self.wanted if w not in have.ms_by_width]
        if not reuse:  # every wanted width this session does not know, the ones the entry lacks first
            missing.sort(key=lambda w: w in previous.curve.ms_by_width)
        with torch.inference_mode():
            samples = time_width_samples(self.scorer, missing, self.repeats, deadline) if missing else {}
        timed = {w: statistics.median(values) for w, values in samples.items()}
        short = [w for w in missing if len(samples.get(w, ())) < self.repeats]
        stand_in = {} if reuse else previous.curve.ms_by_width
        if not reuse and previous.provenance.stale:  # a stand-in's: only where a wanted width is untimed,
            plain = timed.get(1, stand_in.get(1, DEFAULT_PLAIN_MS))  # rescaled to what was timed
            stand_in = {w: ms for w, ms in default_curve(self.key, plain).ms_by_width.items() if w in self.wanted}
        settled = have.settled if reuse else frozenset()
        costs = {**stand_in, **have.ms_by_width, **timed}
        why = f"the measuring ran out of its budget before timing widths {spans(short)} fully" if short else None
        if 1 not in costs:  # not even a plain forward was timed: the stand-in, scaled by nothing known
            return self.fallback(why or "not measured")
        fell = falls(costs)
        if fell is not None:  # noise: decided on the narrower widths' costs, measured again later
            costs = monotone(costs)
            why = why or (f"the cost fell as the width grew (width {fell} under {MIN_FALL_RATIO:g} of a narrower "
                          "one's): timing noise")
        # figures of the previous entry that were not timed again stand in, and stay unreusable
        stale = any(w not in timed and w not in have.ms_by_width for w in stand_in)
        return MeasuredCurve(CostCurve(self.key, costs, settled), Provenance(provisional=why, stale=stale))

    def parse(self, data: dict) -> MeasuredCurve | None:
        costs = {int(w): float(ms) for w, ms in data["ms_by_width"].items()}
        costs = plausible({w: ms for w, ms in costs.items() if math.isfinite(ms)})
        settled = data.get("settled", [])
        settled = frozenset(w for w in settled if type(w) is int and w in costs) if isinstance(settled, list) else frozenset()
        return MeasuredCurve(CostCurve(self.key, costs, settled)) if costs else None

    def replaces(self, result: MeasuredCurve, previous: MeasuredCurve) -> bool:
        """Always: `measure` keeps the previous entry's widths and adds to them (or stands them in
        for the widths it could not time again), so a partial curve holds at least as much."""
        return True

    def fallback(self, why: str) -> MeasuredCurve:
        """A stand-in, measuring nothing: `default_curve` at width 1's cost where this session
        knows it, else the dtype measurement's plain step, else DEFAULT_PLAIN_MS (the chooser
        compares costs by their ratios, and replaces them with the rounds' own times within a few
        rounds: controller.LiveCosts)."""
        have = self.merged(None).ms_by_width
        plain = have.get(1) or self.plain_hint or DEFAULT_PLAIN_MS
        return MeasuredCurve(CostCurve(self.key, {**default_curve(self.key, plain).ms_by_width, **have}),
                             Provenance(provisional=why, stale=True))  # nothing in it measured: never reused

    def describe(self, result: MeasuredCurve) -> str:
        widths = sorted(result.curve.ms_by_width)
        line = (f"the target's forward cost at widths {spans(widths)}: {result.curve.cost(1):.1f} ms at width 1"
                + (f", {result.curve.cost(widths[-1]):.1f} at {widths[-1]}" if len(widths) > 1 else ""))
        return announced(line, result.provenance, SCOPE)


def curve_for(scorer: "TargetScorer", widths: Sequence[int] | None = None, *, fresh: bool = False,
              known: CostCurve | None = None, announce: bool = True, budget: clock.Budget | None = None) -> CostCurve:
    """The curve for this scorer with at least `widths` (default: every width `mars profile
    --widths` shows, or a compiled scorer's few): what `known` and the cache hold, the widths
    missing measured (choice.py's `obtain`). `fresh` measures every width afresh, unbounded."""
    return measured_curve(scorer, widths, fresh=fresh, known=known, announce=announce, budget=budget).curve


def measured_curve(scorer: "TargetScorer", widths: Sequence[int] | None = None, *, fresh: bool = False,
                   known: CostCurve | None = None, announce: bool = True,
                   budget: clock.Budget | None = None) -> MeasuredCurve:
    """`curve_for`'s curve with its provenance (provisional, or a stand-in: `stale`)."""
    wanted = widths or (COMPILED_WIDTHS if scorer.compiled else DEFAULT_WIDTHS)
    if fresh:
        measurement = CurveMeasurement(scorer, wanted, None, FRESH_REPEATS)
        return obtain(measurement, fresh=True, budget=budget or clock.unbounded(), announce=False)
    measurement = CurveMeasurement(scorer, wanted, known)
    if known is not None and all(w in known.ms_by_width for w in measurement.wanted):
        return MeasuredCurve(known)
    found = obtain(measurement, budget=budget, announce=announce)
    return MeasuredCurve(measurement.merged(found.curve), found.provenance)


def settle(scorer: "TargetScorer", curve: CostCurve, widths: Sequence[int], budget: clock.Budget | None = None,
           announce: bool = True) -> CostCurve:
    """`curve` with `widths` (a close chain-or-tree call's) timed again together, SETTLE_REPEATS
    each within the process's budget, their medians replacing the old ones, marked settled and
    cached (provisional when the machine is busy or the budget ran out first). Nothing is measured
    when the budget is spent, nor over a provisional entry that is not due (choice.due): a busy
    machine settles nothing on every call."""
    budget = budget or clock.BUDGET
    entry = read(CurveMeasurement(scorer, widths))
    if budget.spent or (entry is not None and entry.provenance.provisional is not None and not due(entry)):
        return curve  # nothing left to measure with, or a provisional curve that is not due: as it is
    close_call = (f"the chain-or-tree choice is a close call on the measured costs; timing widths {spans(widths)} "
                  f"again (once; at most {budget.left:.0f} s)")
    if announce and not summary.active():  # in a session: a record for its one line, once timed
        notes.note(close_call)
    busy = machine.busy_reason()
    with clock.TALLY.counting(), budget.spending() as deadline, torch.inference_mode():
        samples = time_width_samples(scorer, widths, SETTLE_REPEATS, deadline())
    full = all(len(samples.get(w, ())) >= SETTLE_REPEATS for w in widths)
    timed = {w: statistics.median(values) for w, values in samples.items() if values}
    settled = curve.settled | frozenset(widths) if full else curve.settled
    refreshed = CostCurve(curve.key, {**curve.ms_by_width, **timed}, settled)
    why = busy or (None if full else "the settling ran out of its budget")
    measurement = CurveMeasurement(scorer, widths)
    provenance = Provenance(False, why, clock.wall(), busy is not None)
    new = summary.is_new(measurement.path, True)  # its entry first written by this process?
    save(measurement, MeasuredCurve(refreshed, provenance))
    if announce and summary.active():
        done = f"the chain-or-tree choice was a close call on the measured costs: widths {spans(widths)} timed again"
        summary.announce(summary.Record(measurement.label, None, announced(done, provenance, SCOPE), provenance,
                                        measurement.path, new))
    return refreshed


def settle_close_call(scorer: "TargetScorer", costs: CostCurve, figures: DraftAcceptance,
                      budget: clock.Budget | None = None, announce: bool = True) -> CostCurve:
    """`costs` with the widths of a close chain-or-tree call (cost.SHAPE_CLOSE) at `figures`
    timed again (`settle`), where some are not settled yet; as it is otherwise, and for a compiled
    scorer (its few widths are compiled graphs). One round: what the session does once, and
    `mars tune` until the call stands."""
    verdict = cost.shape_verdict(costs, figures)
    if verdict.closeness > cost.SHAPE_CLOSE or set(verdict.deciding) <= costs.settled or scorer.compiled:
        return costs
    return settle(scorer, costs, verdict.deciding, budget, announce)


def measure_curve(scorer: "TargetScorer", key: dict, widths: Sequence[int] = DEFAULT_WIDTHS, repeats: int = 5,
                  context: int = CONTEXT_TOKENS, deadline: float | None = None) -> CostCurve:
    """Time one forward of each width through `scorer` (so a static or compiled scorer is timed
    as it decodes) after `context` cached tokens of a fixed pseudo-text; widths interleaved,
    stopping by `deadline` (the curve may then lack some widths). Uncached: benchmarks' use."""
    with torch.inference_mode():
        samples = time_width_samples(scorer, widths, repeats, deadline, context)
    return CostCurve(key, {w: statistics.median(values) for w, values in samples.items()})


def time_width_samples(scorer: "TargetScorer", widths: Sequence[int], repeats: int, deadline: float | None,
                       context: int = CONTEXT_TOKENS) -> dict[int, list[float]]:
    """Each width's forwards through `scorer` in milliseconds, after `context` cached tokens of a
    fixed pseudo-text, widths interleaved (clock.time_interleaved)."""
    target = scorer.target
    if deadline is not None and clock.now() >= deadline:  # not even the prefill
        return {}
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, target.vocab_size, (context + max(widths),), generator=generator)
    pending = tokens[context : context + 1]

    def run_width(width: int) -> None:
        scorer.score(pending, DraftTree.chain(tokens[context + 1 : context + width]), width=width)
        scorer.rewind(context)

    device = target.device
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    scorer.start(tokens[:context])
    return clock.time_interleaved(run_width, widths, repeats, synchronize, deadline)


def time_widths(run_width: Callable[[int], None], widths: Sequence[int], repeats: int,
                synchronize: Callable[[], None] = lambda: None, deadline: float | None = None) -> dict[int, float]:
    """Median milliseconds of `run_width(w)` for each width (benchmarks' harness)."""
    samples = clock.time_interleaved(run_width, widths, repeats, synchronize, deadline)
    return {w: statistics.median(values) for w, values in samples.items()}


def plausible(ms_by_width: dict[int, float]) -> dict[int, float]:
    """The widths whose cost could be a real forward's: a hand-edited or corrupted file may hold
    well-formed nonsense (every width 1e-9 ms, or 1e9 ms), and a curve trusted as it is decides
    every round's draft length. Kept: a plausible time (store.plausible_times), and a wider
    forward between a tenth of and 1000 times width 1's (nothing without a plausible width 1)."""
    plain = ms_by_width.get(1)
    if plain is None or not store.plausible_times(plain):
        return {}
    kept = {w: ms for w, ms in ms_by_width.items()
            if 1 <= w <= MAX_PLAUSIBLE_WIDTH and store.plausible_times(ms) and MIN_WIDTH_RATIO <= ms / plain <= MAX_WIDTH_RATIO}
    return {} if falls(kept) is not None else kept  # a curve that falls as the width grows: measured again


def falls(ms_by_width: dict[int, float]) -> int | None:
    """The first width whose cost is under MIN_FALL_RATIO of a narrower width's, and by more than
    MIN_FALL_MS (a curve no real forward gives), or None."""
    highest = 0.0
    for width in sorted(ms_by_width):
        if ms_by_width[width] < MIN_FALL_RATIO * highest and highest - ms_by_width[width] > MIN_FALL_MS:
            return width
        highest = max(highest, ms_by_width[width])
    return None


def monotone(ms_by_width: dict[int, float]) -> dict[int, float]:
    """Each width's cost at least every narrower width's (a wider forward is never taken for
    cheaper than a narrower one: a dip measured under noise would choose wide trees)."""
    highest, kept = 0.0, {}
    for width in sorted(ms_by_width):
        highest = max(highest, ms_by_width[width])
        kept[width] = highest
    return kept


def default_curve(key: dict, plain_ms: float) -> CostCurve:
    """A stand-in curve for a process that could not measure: each extra position costs 10% of a
    plain forward of `plain_ms` (what float32 costs on this project's CPU, about), so chains of a
    few tokens and no trees."""
    return CostCurve(key, {w: plain_ms * (1 + 0.1 * (w - 1)) for w in range(1, MAX_TREE_TOKENS + 2)})


def spans(widths: Sequence[int]) -> str:
    """1, 2, 3, 5, 9 -> "1-3, 5, 9"."""
    runs: list[list[int]] = []
    for width in sorted(widths):
        if runs and width == runs[-1][-1] + 1:
            runs[-1].append(width)
        else:
            runs.append([width])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
