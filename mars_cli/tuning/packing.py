"""`--packed-weights auto`: whether the target's linears run faster on oneDNN's packed weights
(decoding/packing.py) on this machine, measured, never assumed: plain steps and tree-wide
forwards, dense and packed interleaved, once per model, device, dtype and torch, cached under
`<cache>/packing/` (choice.py's protocol).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from ..decoding.kv import KVCache
from ..decoding.packing import PACK_ROWS, Switch, dtype_name, install, problem, remove
from ..errors import UserError
from . import clock, curve, machine, store, summary
from .choice import MeasuredChoice, Provenance, Verdict, announced, decide, obtain, read_verdict

MODES = ("auto", "on", "off")
SCHEMA = 2  # 2: the choice protocol's entries (provisional, measured_at)
FOLDER = "packing"  # <cache>/packing/<hash of the key>.json
WIDTHS = (1, PACK_ROWS)  # what the measurement times: a plain step and a tree round
STEPS = 3  # forwards of each width per timed block
REPEATS = 5  # blocks per variant, dense and packed interleaved; the median counts
PREFERENCE = 0.97  # packed is used when its block takes at most this fraction of dense's
# a first use measures for about this long at most (8 s ran out on the AMX Xeon in a slow minute,
# 55 ms a plain step: two warm-ups with their prefills, then ten blocks)
BUDGET_S = 12.0
VARIANTS = ("dense", "packed")


@dataclass
class PackingChoice:
    """Whether the target's linears run packed, and the measurement that decided it."""

    packed: bool
    problem: str | None = None  # why packing cannot be used here
    ms_dense: float | None = None  # median block: STEPS forwards at each of WIDTHS
    ms_packed: float | None = None
    key: dict = field(default_factory=dict)
    timed_twice: bool = False  # the first blocks were a close call (clock.close_call): pooled with a second set
    follows_dtype: bool = False  # packed within noise because --dtype auto timed this dtype packed (not cached)
    provenance: Provenance = field(default_factory=Provenance)

    def fields(self) -> dict:
        return {"packed": self.packed, "ms_dense": self.ms_dense, "ms_packed": self.ms_packed,
                "timed_twice": self.timed_twice}


class PackingMeasurement(MeasuredChoice[PackingChoice]):
    """Whether packing pays for `target`'s linears here."""

    what, folder, schema, budget_s, label = "packing measurement", FOLDER, SCHEMA, BUDGET_S, "packed linears"

    def __init__(self, target) -> None:
        self.target = target
        self.key = packing_key(target)

    def measure(self, deadline: float | None, previous: PackingChoice | None = None) -> PackingChoice:
        return measure(self.target, self.key, deadline)

    def parse(self, data: dict) -> PackingChoice | None:
        verdict = read_verdict(data, ("packed", "ms_dense", "ms_packed"), PREFERENCE)
        return None if verdict is None else choice_of(verdict, self.key)

    def fallback(self, why: str) -> PackingChoice:
        return PackingChoice(False, key=self.key, provenance=Provenance(provisional=why))  # dense, as before packing

    def describe(self, result: PackingChoice) -> str:
        return describe(result)

    def shown(self, result: PackingChoice) -> str:
        return "on" if result.packed else "off"


def settle(target, mode: str, compiled: bool, timed_packed: bool = False) -> PackingChoice:
    """Pack `target`'s linears or not, for `--packed-weights mode`: `off` never; `on` wherever
    it can be done (else a UserError); `auto` when a measurement (cached) says it pays. A compiled
    scorer's forwards are left to the compiler. `timed_packed`: `--dtype auto` chose the dtype on
    packed timings; then `auto` packs unless dense was clearly faster (`follows_dtype`)."""
    if mode not in MODES:
        raise UserError(f"--packed-weights {mode}: expected auto, on or off")
    if mode == "off":
        remove(target.model)
        return PackingChoice(False, problem="--packed-weights off")
    linears = getattr(target, "linears", "dense")
    if linears != "dense":
        if mode == "on":
            raise UserError(f"--packed-weights on: --dtype {linears} runs the linears on their codes")
        return PackingChoice(False, problem=f"--dtype {linears} runs the linears on their codes")
    why = "a compiled forward is left to torch.compile" if compiled else problem(target.model)
    if why is not None:
        if mode == "on":
            raise UserError(f"--packed-weights on: {why}")
        return PackingChoice(False, problem=why)
    choice = PackingChoice(True) if mode == "on" else choose(target)
    if timed_packed and mode == "auto":
        choice = follows_dtype(choice)
    if choice.packed:
        install(target.model)
    else:
        remove(target.model)
    return choice


def follows_dtype(choice: PackingChoice) -> PackingChoice:
    """A dtype chosen on packed timings runs packed unless dense's block was at most PREFERENCE of
    packed's: the dtype's measurement timed its candidates packed, and a close call between dense
    and packed (dense by default) once ran bfloat16 dense where only its packed steps had been
    timed, at 0.84-0.94x the float32 it had been chosen over (docs/benchmarks.md)."""
    if choice.packed or choice.ms_dense is None or choice.ms_packed is None:
        return choice
    if choice.ms_dense <= PREFERENCE * choice.ms_packed:
        return choice  # dense clearly faster: dense is faster still than what was timed
    said = (f"--packed-weights auto: {choice.key.get('dtype', 'the dtype')} packed, as --dtype auto timed it "
            f"(dense {choice.ms_dense:.0f} ms vs packed {choice.ms_packed:.0f} ms is within noise)")
    # in a session: a detail of the packing choice (it changes what a measurement now announces)
    summary.announce(summary.Record(PackingMeasurement.label, "on", said, None, store.cache_path(choice.key, FOLDER),
                                    False), once=True)
    return dataclasses.replace(choice, packed=True, follows_dtype=True)


def packing_key(target) -> dict:
    """What the measurement depends on that can change between runs on one machine."""
    return {**machine.machine_key(target.fingerprint, target.device), "dtype": dtype_name(target.dtype),
            "rows": PACK_ROWS, "widths": list(WIDTHS)}


def choose(target, *, fresh: bool = False, budget: clock.Budget | None = None) -> PackingChoice:
    """Whether packing pays for `target` here: the cached answer, else measured (choice.py's
    `obtain`), with one note; `fresh` measures again and says nothing. Packing is left installed
    only if chosen (the caller installs it)."""
    return obtain(PackingMeasurement(target), fresh=fresh, budget=budget, announce=not fresh)


def measure(target, key: dict, deadline: float | None = None) -> PackingChoice:
    """Time blocks of STEPS forwards at each of WIDTHS after curve.CONTEXT_TOKENS cached tokens,
    dense and packed interleaved (REPEATS each, and REPEATS more when the first say a close call),
    stopping by `deadline`; packed wins at PREFERENCE of dense or less."""
    why = problem(target.model)
    if why is not None:  # refused packed forwards would time dense twice, and noise could pick "packed"
        return PackingChoice(False, problem=why, key=key)
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, target.vocab_size, (1, curve.CONTEXT_TOKENS), generator=generator)
    feeds = [torch.randint(0, target.vocab_size, (1, width), generator=generator) for width in WIDTHS]
    model = target.model
    switch = Switch(model)  # packed once: a block times forwards, not packing
    caches: dict[str, KVCache] = {}

    def run(variant: str) -> None:
        switch.set(variant == "packed")
        if variant not in caches:
            caches[variant] = KVCache(model)
            caches[variant].forward(context.to(target.device))
        for feed in feeds:
            for _ in range(STEPS):
                caches[variant].forward(feed.to(target.device))
                caches[variant].truncate(curve.CONTEXT_TOKENS)

    try:
        with torch.inference_mode():  # cut short before packed was timed: dense, as before packing
            verdict = decide(lambda: clock.time_interleaved(run, VARIANTS, REPEATS, deadline=deadline), VARIANTS,
                             REPEATS, PREFERENCE)
    finally:
        remove(model)
    return choice_of(verdict, key)


def choice_of(verdict: Verdict, key: dict) -> PackingChoice:
    return PackingChoice(verdict.used, None, verdict.reference_ms, verdict.candidate_ms, key, verdict.timed_twice,
                         provenance=verdict.provenance)


def describe(choice: PackingChoice) -> str:
    """The one line a measured choice is announced with."""
    verdict = "packed" if choice.packed else "left dense"
    dtype = choice.key.get("dtype", "")
    line = (f"--packed-weights auto: the target's {dtype} linears {verdict} (a plain step and a {PACK_ROWS}-wide "
            f"round, {STEPS} each: {choice.ms_dense:.0f} ms dense, {choice.ms_packed:.0f} ms packed"
            f"{', timed twice: a close call' if choice.timed_twice else ''})"
            if choice.ms_dense is not None and choice.ms_packed is not None
            else f"--packed-weights auto: the target's {dtype} linears {verdict}")
    return announced(line, choice.provenance, "model, device, dtype and torch version")
