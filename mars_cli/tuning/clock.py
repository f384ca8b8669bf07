"""The measuring clock, the interleaved timing harness and the process's measuring budget.

Every timing of the tuning layer reads `now()` and every entry's date `wall()`, so a test can
drive both. `time_interleaved` times variants A B A B (drift on a shared machine then spreads
over all of them alike) and stops at a deadline keeping what it timed. `BUDGET` bounds what one
process spends on all its measurements together: a one-liner never waits on tuning for long,
busy machine or not.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from typing import Callable, Iterator, Sequence, TypeVar

T = TypeVar("T")
PROCESS_BUDGET_S = 10.0  # all the measuring one process does unasked (`mars tune` is unbounded)
# The timed loops get this much of it: around them a measurement converts and packs weights,
# prefills and checks the load, which no deadline interrupts (a first call on a busy 2-core EPYC
# spent 12.6 s in the tuning layer with its loops stopping at 10)
LOOPS_S = 8.0
# A verdict whose measured ratio lies this close to its line (packed against dense, bfloat16 against
# float32) is timed once more before it is trusted, the blocks pooled: on the Intel Xeon with AMX one
# packing measurement read 1.00 of dense where three taken minutes later read 0.76 to 0.92.
CLOSE_CALL = 0.05


def now() -> float:
    """Seconds on the measuring clock (monotonic)."""
    return time.perf_counter()


def wall() -> float:
    """Seconds since the epoch: when an entry was measured (compared across processes)."""
    return time.time()


class Budget:
    """Seconds of measuring left to this process, over every measured choice it makes. A
    measurement inside another (a dtype's cost curves) shares the outer one's deadline."""

    def __init__(self, seconds: float = PROCESS_BUDGET_S) -> None:
        self.left = seconds
        self._depth = 0
        self._until: float | None = None  # the outermost measurement's deadline, while one runs

    @property
    def spent(self) -> bool:
        return self.left <= 0 or (self._until is not None and now() >= self._until)

    def deadline(self, most: float | None = None) -> float | None:
        """The `now()` by which a measurement starting now must stop: within what is left (and
        within an enclosing measurement's deadline) and within its own `most` seconds (None: no
        cap of its own). An unbounded budget (`mars tune`) caps nothing."""
        if math.isinf(self.left):
            return None
        seconds = self.left if most is None else min(most, self.left)
        until = now() + max(seconds, 0.0)
        return until if self._until is None else min(until, self._until)

    @contextlib.contextmanager
    def spending(self) -> Iterator[Callable[[float | None], float | None]]:
        """Measure within this budget: yields `deadline`, and charges the time spent inside the
        outermost `spending`."""
        outermost = self._depth == 0
        if outermost:
            self._until = self.deadline()
        self._depth += 1
        started = now()
        try:
            yield self.deadline
        finally:
            self._depth -= 1
            if outermost:
                self.left -= now() - started
                self._until = None


BUDGET_VARIABLE = "MARS_TUNING_BUDGET_S"  # overrides LOOPS_S: 0 never measures unasked; CI may raise it
MAX_BUDGET_S = 3600.0  # the most a number in it buys; larger ones are clamped, with a note
UNBOUNDED_WORDS = ("inf", "infinity")  # spelled out: no bound at all, as `mars tune`


def process_budget() -> Budget:
    """This process's budget: LOOPS_S, or $MARS_TUNING_BUDGET_S seconds (a number from 0 to
    MAX_BUDGET_S, or `inf` spelled out for no bound). Anything else is said once: what is no
    finite number of seconds >= 0 (nan, -1, abc, and 1e309, which a float reads as infinite: a
    one-liner spent 79 s tuning on it) leaves LOOPS_S; a larger number is clamped to MAX_BUDGET_S."""
    from .. import notes

    value = os.environ.get(BUDGET_VARIABLE)
    if value is None:
        return Budget(LOOPS_S)
    if value.strip().lower().lstrip("+") in UNBOUNDED_WORDS:
        return Budget(math.inf)
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (seconds >= 0 and math.isfinite(seconds)):
        overflow = " (a float reads it as infinite; `inf` spelled out lifts the bound)" if seconds == math.inf else ""
        notes.note(f"${BUDGET_VARIABLE}={value[:40]!r} is not a finite number of seconds >= 0{overflow}; measuring "
                   f"within {LOOPS_S:g} s", once=True)
        return Budget(LOOPS_S)
    if seconds > MAX_BUDGET_S:
        notes.note(f"${BUDGET_VARIABLE}={value[:40]!r} is more than {MAX_BUDGET_S:g} s; measuring within "
                   f"{MAX_BUDGET_S:g} s (`inf` spelled out lifts the bound)", once=True)
        return Budget(MAX_BUDGET_S)
    return Budget(seconds)


BUDGET = process_budget()  # this process's; `mars tune` passes an unbounded one (`unbounded`)


class Tally:
    """Seconds this process spent in the tuning layer (cache reads, lock waits and measuring):
    start-up's tuning phase in `--stats` and `--json`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self._depth += 1
        started = now()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.seconds += now() - started


TALLY = Tally()


def unbounded() -> Budget:
    """An endless budget: measurements asked for explicitly (`mars tune`, `mars profile`)."""
    return Budget(math.inf)


def time_interleaved(run: Callable[[T], None], items: Sequence[T], repeats: int,
                     synchronize: Callable[[], None] = lambda: None, deadline: float | None = None,
                     prepare: Callable[[T], None] = lambda item: None) -> dict[T, list[float]]:
    """Milliseconds of each call `run(item)`, `repeats` of them per item: each item warmed up once
    just before its first timing, then items interleaved within each further repeat. With a
    `deadline` (on `now()`), nothing starts that would end past it, as far as the item's last
    call says (its warm-up, then its last timing; before its first, the longest call so far):
    items not reached are left out, and the items
    reached keep the repeats they got; none at all when the deadline has passed already.
    `prepare(item)` runs before each call, untimed (the int8 head's measurement evicts the head's
    weights there)."""
    samples: dict[T, list[float]] = {}
    last: dict[T, float] = {}  # seconds of each item's latest call

    def fits(item: T) -> bool:
        """Whether `item`'s next call would end by the deadline, going by its last call or, for
        its first, the longest call so far (widths come in ascending order: no cheaper guess)."""
        guess = last.get(item, max(last.values(), default=0.0))
        return deadline is None or now() + guess < deadline

    def called(item: T, timed: bool) -> None:
        prepare(item)
        synchronize()
        start = now()
        run(item)
        synchronize()
        last[item] = now() - start
        if timed:
            samples.setdefault(item, []).append(last[item] * 1000)

    for item in items:
        if not fits(item):
            break
        called(item, timed=False)  # warm-up: an item's first call pays for allocation
        if not fits(item):
            break
        called(item, timed=True)
    reached = list(samples)
    for _ in range(repeats - 1):
        for item in reached:
            if not fits(item):
                return samples
            called(item, timed=True)
    return samples


def medians(samples: dict[T, list[float]], items: Sequence[T]) -> list[float | None]:
    """Each item's median time, None for an item the deadline left untimed."""
    return [statistics.median(samples[item]) if samples.get(item) else None for item in items]


def close_call(ratio: float, line: float) -> bool:
    """Whether `ratio` (a candidate's time over the reference's) is within CLOSE_CALL of `line`."""
    return abs(ratio - line) <= CLOSE_CALL


def pooled(first: dict[T, list[float]], second: dict[T, list[float]]) -> dict[T, list[float]]:
    """Two `time_interleaved` results as one: each item's blocks from both."""
    return {item: first.get(item, []) + second.get(item, []) for item in {**first, **second}}
