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
import statistics
import time
from typing import Callable, Iterator, Sequence, TypeVar

T = TypeVar("T")
PROCESS_BUDGET_S = 10.0  # all the measuring one process does unasked (`mars tune` is unbounded)
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
    """Seconds of measuring left to this process, over every measured choice it makes."""

    def __init__(self, seconds: float = PROCESS_BUDGET_S) -> None:
        self.left = seconds
        self._depth = 0

    @property
    def spent(self) -> bool:
        return self.left <= 0

    def deadline(self, most: float | None = None) -> float | None:
        """The `now()` by which a measurement starting now must stop: within what is left and
        within its own `most` seconds (None: unbounded, for `mars tune`)."""
        seconds = self.left if most is None else min(most, self.left)
        return None if math.isinf(seconds) else now() + max(seconds, 0.0)

    @contextlib.contextmanager
    def spending(self) -> Iterator[Callable[[float | None], float | None]]:
        """Measure within this budget: yields `deadline`, and charges the time spent inside the
        outermost `spending` (a dtype's measurement measures cost curves inside its own)."""
        self._depth += 1
        started = now()
        try:
            yield self.deadline
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.left -= now() - started


BUDGET = Budget()  # this process's; `mars tune` passes an unbounded one (`unbounded`)


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
    `deadline` (on `now()`), stop once it has passed and keep what was timed: the first item is
    always timed (once, unwarmed, when the deadline has passed already), items not reached are
    left out, and the items reached keep the repeats they got. `prepare(item)` runs before each
    call, untimed (the int8 head's measurement evicts the head's weights there)."""
    samples: dict[T, list[float]] = {}

    def timed(item: T) -> None:
        prepare(item)
        synchronize()
        start = now()
        run(item)
        synchronize()
        samples.setdefault(item, []).append((now() - start) * 1000)

    def out_of_time() -> bool:
        return deadline is not None and bool(samples) and now() >= deadline

    for item in items:
        if out_of_time():
            break
        if deadline is None or now() < deadline:  # (a prefill that spent the budget warmed up the first)
            prepare(item)
            run(item)  # warm-up: an item's first call pays for allocation
        timed(item)
    reached = list(samples)
    for _ in range(repeats - 1):
        for item in reached:
            if out_of_time():
                break
            timed(item)
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
