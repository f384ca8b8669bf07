"""Cached speed measurements the machine no longer matches: made provisional, so that the next
quiet run measures them again.

The dtype choice, the packing choice, the int8 head choice and the cost curves are measured once
per model, device and torch version, then cached (dtype.py, packing.py, int8.py, curve.py). A shared machine's
speeds drift, and not alike for every kernel: one evening on the Intel Xeon with AMX this project
met, bfloat16 forwards ran at 2-3x the time of their cached curve while float32 ran close to its
own, so the cached choice of bfloat16 made the default slower than float32 would have been. A
session therefore compares its own timed target forwards with what the cached measurements it
decodes by expected; when they differ by more than DRIFT either way, over at least MIN_ROUNDS
rounds, those entries are made provisional (choice.mark_provisional), with one note: used as they
are until a run finds the machine quiet, which measures them again. Not while the load average
says another job shares the machine (machine.busy_reason): that explains the slowness. Deleting
them instead once made every run on a busy machine measure again. A session never switches dtype
or packing midway (its output would change within one run), and the cost model already follows
the session's own timings (controller.LiveCosts): what is fixed here is the next run.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable, Iterable, Mapping

from .choice import mark_provisional

DRIFT = 1.5  # observed / expected beyond this (or below its inverse): the machine has changed
# Forwards that cost less than this are mostly Python overhead and jitter (the tests' tiny models):
# their ratios say nothing about the machine
MIN_MS = 5.0
MIN_ROUNDS = 32  # timed forwards before a session's own figure is trusted


def ratio(observed: Mapping[int, float], expected: Callable[[int], float | None]) -> float | None:
    """The median, over widths, of the session's own milliseconds per forward (`observed`, by
    width) over what the cached measurement expected at that width; None where nothing compares
    (no expectation, or one below MIN_MS)."""
    ratios = []
    for width, ms in observed.items():
        wanted = expected(width)
        if wanted is not None and wanted >= MIN_MS and ms > 0:
            ratios.append(ms / wanted)
    return statistics.median(ratios) if ratios else None


def drifted(found: float | None) -> bool:
    """Whether a `ratio` says the cached measurements no longer describe this machine."""
    return found is not None and not 1 / DRIFT <= found <= DRIFT


def forget(paths: Iterable[Path], found: float) -> list[Path]:
    """Make the settled entries at `paths` provisional; returns those changed (absent, already
    provisional or unwritable ones are skipped: the worst case is one more run on a stale one)."""
    why = f"the session's forwards ran {found:.1f}x the time it gives"
    return [path for path in dict.fromkeys(paths) if mark_provisional(path, why)]


def describe(found: float, forgotten: list[str]) -> str:
    """The one note a drift is announced with."""
    pace = "slower" if found > 1 else "faster"
    return (f"this session's target forwards ran {found:.1f}x the time the cached measurements give ({pace}: the "
            f"machine is not as it was when they were taken); {', '.join(forgotten)} made provisional, measured "
            "again on the next quiet run")
