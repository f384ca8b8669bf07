"""The llama.cpp engine's thread count, measured, never assumed: blocks of plain steps at each
candidate count (1, half the cores, all of them), interleaved, once per machine, model, weight
type and binding, cached under `<cache>/llamacpp-threads/` (choice.py's protocol: busy-safe,
provisional when cut short). All the cores is the fallback, as llama.cpp's own default.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from ..decoding.tree import DraftTree
from . import clock, curve, machine
from .choice import MeasuredChoice, Provenance, obtain

SCHEMA = 1
FOLDER = "llamacpp-threads"
STEPS = 4  # plain forwards per timed block
REPEATS = 3  # blocks per candidate; the median counts
BUDGET_S = 4.0
PREFERENCE = 0.97  # fewer threads are taken when their block takes at most this fraction of the most's


@dataclass
class ThreadsChoice:
    """How many threads llama.cpp decodes with, and the blocks that decided it."""

    threads: int
    ms_by_threads: dict[int, float] = field(default_factory=dict)
    key: dict = field(default_factory=dict)
    provenance: Provenance = field(default_factory=Provenance)

    def fields(self) -> dict:
        return {"threads": self.threads, "ms_by_threads": {str(n): ms for n, ms in self.ms_by_threads.items()}}


def candidates(cores: int) -> list[int]:
    return sorted({1, max(1, cores // 2), cores})


def pick(ms_by_threads: dict[int, float], cores: int) -> int:
    """All the cores unless fewer threads are clearly faster (at PREFERENCE of its block or less)."""
    most = ms_by_threads.get(cores)
    if most is None:
        return cores
    fewer = [(ms, n) for n, ms in ms_by_threads.items() if n < cores and ms <= PREFERENCE * most]
    return min(fewer)[1] if fewer else cores


class ThreadsMeasurement(MeasuredChoice[ThreadsChoice]):
    """The thread count at which `scorer`'s plain steps run fastest here."""

    what, folder, schema, budget_s, label = ("llama.cpp thread count measurement", FOLDER, SCHEMA, BUDGET_S,
                                             "llama.cpp threads")

    def __init__(self, scorer) -> None:
        self.scorer = scorer
        self.cores = scorer.engine.settings.thread_count()
        target = scorer.target
        self.key = {**machine.machine_key(target.fingerprint, target.device), "dtype": target.dtype,
                    **{k: v for k, v in scorer.engine_key().items() if k != "threads"},
                    "candidates": candidates(self.cores)}

    def measure(self, deadline: float | None, previous: ThreadsChoice | None = None) -> ThreadsChoice:
        timed = time_threads(self.scorer, candidates(self.cores), deadline)
        ms = {n: statistics.median(values) for n, values in timed.items() if values}
        short = [n for n in candidates(self.cores) if len(timed.get(n, ())) < REPEATS]
        why = "the measuring ran out of its budget before timing every thread count" if short else None
        return ThreadsChoice(pick(ms, self.cores) if not short else self.cores, ms, self.key, Provenance(provisional=why))

    def parse(self, data: dict) -> ThreadsChoice | None:
        threads = data["threads"]
        if type(threads) is not int or threads not in candidates(self.cores):
            return None
        ms = {int(n): float(value) for n, value in data["ms_by_threads"].items()}
        return ThreadsChoice(threads, ms, self.key)

    def fallback(self, why: str) -> ThreadsChoice:
        return ThreadsChoice(self.cores, key=self.key, provenance=Provenance(provisional=why))

    def describe(self, result: ThreadsChoice) -> str:
        shown = ", ".join(f"{n}: {ms:.1f} ms" for n, ms in sorted(result.ms_by_threads.items()))
        return (f"--engine llama.cpp: {result.threads} thread{'s' if result.threads > 1 else ''}"
                + (f" (a block of {STEPS} plain steps with {shown})" if shown else ""))

    def shown(self, result: ThreadsChoice) -> str:
        return str(result.threads)


def time_threads(scorer, counts: list[int], deadline: float | None) -> dict[int, list[float]]:
    """Milliseconds of STEPS plain forwards after curve.CONTEXT_TOKENS tokens, per thread count,
    interleaved (clock.time_interleaved); the scorer is left on all the cores."""
    target = scorer.target
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, target.vocab_size, (curve.CONTEXT_TOKENS + STEPS,), generator=generator)
    context = curve.CONTEXT_TOKENS
    scorer.start(tokens[:context])
    empty = DraftTree.empty(target.device)

    def block(threads: int) -> None:
        scorer.set_threads(threads)
        for step in range(STEPS):
            scorer.score(tokens[context + step : context + step + 1], empty, width=1)
            scorer.keep([0])
        scorer.rewind(context)

    try:
        return clock.time_interleaved(block, counts, REPEATS, deadline=deadline)
    finally:
        scorer.set_threads(scorer.engine.settings.thread_count())


def choose(scorer, *, fresh: bool = False, budget: clock.Budget | None = None) -> ThreadsChoice:
    """The thread count for `scorer`'s engine: cached, else measured (one note)."""
    return obtain(ThreadsMeasurement(scorer), fresh=fresh, budget=budget, announce=not fresh)
