"""`--int8-head auto`: whether a draft head's linears draft faster on int8 rows (head/int8.py)
on this machine, measured, never assumed: drafting blocks with the head's weights evicted, as a
round's target pass evicts them, full and int8 interleaved, once per model, head shape, device and
torch, cached under `<cache>/int8-head/` (choice.py's protocol).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..decoding import packing, quantized
from ..decoding.quantized import ACTIVATION_BITS
from ..decoding.kv import KVCache
from ..errors import UserError
from ..head.int8 import Int8Forward, eligible, install, problem, remove
from ..head.parts import HeadCache
from . import clock, curve, machine
from .choice import MeasuredChoice, Provenance, Verdict, announced, decide, obtain, read_verdict

MODES = ("auto", "on", "off")
SCHEMA = 2  # 2: the choice protocol's entries (provisional, measured_at)
FOLDER = "int8-head"  # <cache>/int8-head/<hash of the key>.json
TRUE_PAIRS = 3  # a measured block: the round's true pairs read, then LEVELS tree levels of FRONTIER
LEVELS = 3
FRONTIER = 4
VARIANTS = ("full", "int8")  # the head's own weights (dense or packed), and int8 rows
REPEATS = 11  # blocks per variant, full and int8 interleaved; the median counts
PREFERENCE = 0.97  # int8 is used when its block takes at most this fraction of the full one's
BUDGET_S = 6.0  # a first use measures for about this long at most


@dataclass
class Int8Choice:
    """Whether the head's linears run on int8 weights, and the measurement that decided it."""

    used: bool
    problem: str | None = None  # why int8 cannot be used here
    ms_full: float | None = None  # median drafting block on the head's own weights
    ms_int8: float | None = None
    key: dict = field(default_factory=dict)
    timed_twice: bool = False  # the first blocks were a close call: pooled with a second set
    provenance: Provenance = field(default_factory=Provenance)

    def fields(self) -> dict:
        return {"used": self.used, "ms_full": self.ms_full, "ms_int8": self.ms_int8, "timed_twice": self.timed_twice}


class Int8Measurement(MeasuredChoice[Int8Choice]):
    """Whether int8 rows pay for `head` drafting beside `target` here."""

    what, folder, schema, budget_s, label = "int8 head measurement", FOLDER, SCHEMA, BUDGET_S, "int8 head"

    def __init__(self, head: torch.nn.Module, target) -> None:
        self.head, self.target = head, target
        self.key = int8_key(head, target)

    def measure(self, deadline: float | None, previous: Int8Choice | None = None) -> Int8Choice:
        return measure(self.head, self.target, self.key, deadline)

    def parse(self, data: dict) -> Int8Choice | None:
        verdict = read_verdict(data, ("used", "ms_full", "ms_int8"), PREFERENCE)
        return None if verdict is None else choice_of(verdict, self.key)

    def fallback(self, why: str) -> Int8Choice:
        return Int8Choice(False, key=self.key, provenance=Provenance(provisional=why))  # the head's own weights

    def describe(self, result: Int8Choice) -> str:
        return describe(result)

    def shown(self, result: Int8Choice) -> str:
        return "on" if result.used else "off"


def settle(head: torch.nn.Module, target, mode: str, compiled: bool = False) -> Int8Choice:
    """Put `head`'s linears on int8 rows or not, for `--int8-head mode`: `off` never; `on` wherever
    it can be done (else a UserError); `auto` when a measurement (cached) says it pays. A compiled
    drafter's steps are left to the compiler."""
    if mode not in MODES:
        raise UserError(f"--int8-head {mode}: expected auto, on or off")
    if mode == "off":
        remove(head)
        return Int8Choice(False, problem="--int8-head off")
    linears = getattr(target, "linears", "dense")
    if linears in ACTIVATION_BITS:  # the head's linears on codes too (8-bit: drafts only)
        if mode == "on":
            raise UserError(f"--int8-head on: under --dtype {linears} the head's linears run on 8-bit codes")
        remove(head)
        quantized.install(head, fresh_levels=quantized.LEVELS_INT8, search=False)  # a head's weights are floats
        quantized.use_activations(head, linears)
        return Int8Choice(False, problem=f"--dtype {linears}: the head's linears run on 8-bit codes")
    why = "a compiled drafter is left to torch.compile" if compiled else problem(head)
    if why is not None:
        if mode == "on":
            raise UserError(f"--int8-head on: {why}")
        return Int8Choice(False, problem=why)
    choice = Int8Choice(True) if mode == "on" else choose(head, target)
    if choice.used:
        install(head)
    else:
        remove(head)
    return choice


def int8_key(head: torch.nn.Module, target) -> dict:
    """What the measurement depends on that can change between runs on one machine: the machine,
    the target (whose pass evicts the head), the head's dtype, its linears' shapes and whether they
    were packed."""
    layers = eligible(head)
    return {**machine.machine_key(target.fingerprint, target.device),
            "dtype": str(head.fc.weight.dtype).replace("torch.", ""),
            "linears": [list(layer.weight.shape) for layer in layers],
            "packed": any(isinstance(layer.__dict__.get("forward"), packing.PackedForward) for layer in layers)}


def choose(head: torch.nn.Module, target, *, fresh: bool = False, budget: clock.Budget | None = None) -> Int8Choice:
    """Whether int8 weights pay for `head` beside `target` here: the cached answer, else measured
    (choice.py's `obtain`), with one note; `fresh` measures again and says nothing. The head is
    left on its own weights (the caller installs)."""
    return obtain(Int8Measurement(head, target), fresh=fresh, budget=budget, announce=not fresh)


def measure(head: torch.nn.Module, target, key: dict, deadline: float | None = None) -> Int8Choice:
    """Time drafting blocks (TRUE_PAIRS true pairs read and scored, then LEVELS levels of FRONTIER
    pairs, each scored), each after a plain target step that evicts the head's weights as a round's
    verification does; full and int8 interleaved (REPEATS each, REPEATS more on a close call)."""
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, target.vocab_size, (1, curve.CONTEXT_TOKENS), generator=generator)
    step = torch.randint(0, target.vocab_size, (1, 1), generator=generator)
    dtype, device = head.fc.weight.dtype, head.fc.weight.device
    features = torch.randn(curve.CONTEXT_TOKENS, head.feature_width, generator=generator).to(device, dtype)
    tokens = context[0].to(device)
    kept = curve.CONTEXT_TOKENS - TRUE_PAIRS
    evictor = KVCache(target.model)
    head_cache = HeadCache()
    own = {layer: layer.__dict__.get("forward") for layer in eligible(head)}  # dense (None) or packed
    with torch.no_grad():
        quantized = {layer: Int8Forward(layer) for layer in own}  # once: a block times drafting, not quantizing

    def use(variant: str) -> None:
        for layer, forward in (quantized if variant == "int8" else own).items():
            if forward is None:
                layer.__dict__.pop("forward", None)
            else:
                layer.forward = forward

    def evict(variant: str) -> None:
        """The variant's forwards in place, then a target step, untimed: the head's weights leave the caches."""
        use(variant)
        evictor.forward(step.to(target.device))
        evictor.truncate(curve.CONTEXT_TOKENS)

    def block(variant: str) -> None:
        """A round's drafting: the true pairs read and scored, then LEVELS levels of FRONTIER, each scored."""
        states = head.step(features[kept:], tokens[kept:], head_cache)
        torch.log_softmax(head.logits(states[-1:]).float(), dim=-1).topk(FRONTIER)
        fed = states[-1:].expand(FRONTIER, -1).contiguous()
        for _ in range(LEVELS):
            cached = len(head_cache)
            visible = torch.ones(FRONTIER, cached + FRONTIER, dtype=torch.bool, device=device)
            fed = head.step(fed, tokens[:FRONTIER], head_cache, torch.full((FRONTIER,), cached, device=device), visible)
            torch.log_softmax(head.logits(fed).float(), dim=-1).topk(FRONTIER)
        head_cache.truncate(kept)

    def timed(limit: float | None) -> dict[str, list[float]]:
        return clock.time_interleaved(block, VARIANTS, REPEATS, deadline=limit, prepare=evict)

    if deadline is not None and clock.now() >= deadline:  # not even the prefill: the head's own weights
        return Int8Choice(False, None, None, None, key, provenance=Provenance(provisional="not measured in time"))
    try:
        with torch.inference_mode():
            evictor.forward(context.to(target.device))
            head.step(features[:kept], tokens[:kept], head_cache)
            verdict = decide(lambda: timed(deadline), VARIANTS, REPEATS, PREFERENCE)  # cut short: its own weights
    finally:
        use("full")
    return choice_of(verdict, key)


def choice_of(verdict: Verdict, key: dict) -> Int8Choice:
    return Int8Choice(verdict.used, None, verdict.reference_ms, verdict.candidate_ms, key, verdict.timed_twice,
                      provenance=verdict.provenance)


def describe(choice: Int8Choice) -> str:
    """The one line a measured choice is announced with."""
    verdict = "int8" if choice.used else "its own"
    line = (f"--int8-head auto: the draft head's linears on {verdict} weights (a round's drafting, its weights "
            f"evicted: {choice.ms_full:.1f} ms on its own, {choice.ms_int8:.1f} ms on int8"
            f"{', timed twice: a close call' if choice.timed_twice else ''})"
            if choice.ms_full is not None and choice.ms_int8 is not None
            else f"--int8-head auto: the draft head's linears on {verdict} weights")
    return announced(line, choice.provenance, "model, head, dtype, device and torch version")
