"""One protocol for every measured choice: key, cached entry, lock, budget, plausibility,
provisional entries on a busy machine, forgetting on drift, and one note (in a session, one line
for all its choices: summary.py).

A `MeasuredChoice` says what it measures (`key`, `measure`), how to read its entry back
(`parse`, which refuses anything implausible), what to run on when nothing can be measured
(`fallback`) and how to announce it (`describe`); `obtain` does the rest, the same for the
dtype, packing, the int8 head and the cost curve:

- a settled entry is read and used: a warm run measures nothing;
- otherwise one process measures, under the entry's lock, within what is left of the process's
  budget (clock.BUDGET); another process waits at most that long, then runs on the fallback;
- a measurement taken while the machine is busy, cut short by the budget, or never reached
  still decides this run, and is stored as *provisional* with its date: later runs use it
  without measuring until RETRY_AFTER_S have passed and the machine is quiet (or `mars tune`
  is run). Measuring again on every call under load once took a one-liner 11-16 s;
- drift (drift.py) turns a settled entry provisional: measured again once the machine is quiet;
- a re-measurement never makes an answer worse: one cut short or taken on a busy machine keeps the
  entry it re-measured (`replaces`), re-dated, unless the choice says its partial answer is the
  better one; `mars tune` (`fresh`) replaces whatever it measures.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Generic, TypeVar

from .. import notes
from . import clock, machine, store, summary

RETRY_AFTER_S = 600.0  # a provisional entry is measured again after this long, on a quiet machine
# ... or at once on a quiet machine, when it was cut short there (a first use on a quiet machine
# goes on where it stopped), up to this many times in a row
QUIET_ATTEMPTS = 3
LOCK_WAIT_S = 30.0  # the most a process waits for another's measurement (and never past its budget)


@dataclass
class Provenance:
    """Where a result came from: the cache or a measurement now, and whether it is provisional."""

    cached: bool = False
    provisional: str | None = None  # why it is not the settled answer (busy, cut short, not reached)
    measured_at: float | None = None  # clock.wall() when it was measured (or fell back)
    busy: bool = False  # the machine was busy then: measured again only after RETRY_AFTER_S
    attempts: int = 1  # measurements in a row that ended provisional on a quiet machine
    stale: bool = False  # its figures no longer describe the machine (drift.py): none of them reused

    @property
    def reusable(self) -> bool:
        """Whether a measurement may keep these figures and add to them (a cost curve's widths):
        settled ones, and those cut short on a quiet machine; not busy or stale ones."""
        return not (self.busy or self.stale)


R = TypeVar("R")


class MeasuredChoice(ABC, Generic[R]):
    """One kind of measurement of this machine. Subclasses set the class attributes, `key` in
    their __init__, and the four methods; results carry a `provenance` and a `fields()` dict for
    their entry."""

    what: str  # "dtype measurement": in notes
    label: str = ""  # "dtype": in the one summary line of a session's tuning (summary.py); `what` where empty
    folder: str  # <cache>/<folder>/
    schema: int
    budget_s: float | None = None  # at most this long, within the process's budget
    key: dict  # everything the answer depends on that can change between runs on one machine (set by __init__)


    @abstractmethod
    def measure(self, deadline: float | None, previous: R | None) -> R:
        """Measure now, stopping by `deadline` (clock.now(); None: unbounded); `previous`: the
        entry measured before, provisional (a cost curve keeps its widths). A measurement cut at
        any point returns a valid result, its provenance's `provisional` saying why."""

    @abstractmethod
    def parse(self, data: dict) -> R | None:
        """The result an entry's fields hold, or None when anything is missing or implausible
        (store.ENTRY_ERRORS raised here mean the same)."""

    @abstractmethod
    def fallback(self, why: str) -> R:
        """The safe answer when nothing was measured (`why`: one clause)."""

    def replaces(self, result: R, previous: R) -> bool:
        """Whether `result`, measured now in place of the entry `previous`, may replace it: a complete
        measurement always; one cut short or taken on a busy machine never, by default (its verdict
        may rest on candidates it never reached: a cut-short dtype measurement fell back to float32
        over a settled q4a8). A subclass says when a partial one is still the better answer (it
        weighed the previous answer too, or it only adds to the previous entry's figures)."""
        return result.provenance.provisional is None  # type: ignore[attr-defined]

    def complete(self, result: R) -> bool:
        """Whether a cached result answers this use in full (a cost curve: all the widths asked)."""
        return True

    @abstractmethod
    def describe(self, result: R) -> str:
        """The one line that announces a result measured now (or provisional)."""

    def shown(self, result: R) -> str | None:
        """What the summary line shows beside `label` ("float32"); None: the label alone."""
        return None

    @property
    def path(self) -> Path:
        return store.cache_path(self.key, self.folder)


def read(choice: MeasuredChoice[R], path: Path | None = None) -> R | None:
    """The entry's result (`provenance.cached` True), or None when absent or refused."""
    data = store.read_entry(path or choice.path, choice.schema, choice.key)
    if data is None:
        return None
    try:
        result = choice.parse(data)
        provisional, at = data.get("provisional"), store.number(data.get("measured_at"))
        busy, attempts, stale = data.get("busy", False), int(data.get("attempts", 1)), data.get("stale", False)
    except store.ENTRY_ERRORS:
        return None
    if result is None or (provisional is not None and not isinstance(provisional, str)):
        return None
    if not isinstance(busy, bool) or not isinstance(stale, bool):
        return None
    result.provenance = Provenance(True, provisional, at, busy, attempts, stale)  # type: ignore[attr-defined]
    return result


def due(result: object) -> bool:
    """Whether a cached result should be measured again now, on a machine that is quiet now: a
    provisional one older than RETRY_AFTER_S, or one cut short on a quiet machine (fewer than
    QUIET_ATTEMPTS times in a row)."""
    provenance: Provenance = result.provenance  # type: ignore[attr-defined]
    if provenance.provisional is None:
        return False
    age = clock.wall() - (provenance.measured_at or 0.0)
    soon = not provenance.busy and provenance.attempts < QUIET_ATTEMPTS
    return (soon or age >= RETRY_AFTER_S) and machine.busy_reason() is None


def save(choice: MeasuredChoice[R], result: R) -> None:
    """Write `result` as the entry (provisional or settled); a cache that cannot be written is
    noted once, and the result then serves this run only."""
    provenance: Provenance = result.provenance  # type: ignore[attr-defined]
    text = json.dumps({"schema": choice.schema, "key": choice.key, **result.fields(),  # type: ignore[attr-defined]
                       "provisional": provenance.provisional, "measured_at": provenance.measured_at,
                       "busy": provenance.busy, "attempts": provenance.attempts, "stale": provenance.stale}, indent=1)
    if not store.save_or_note(choice.path, text, choice.what):
        if provenance.provisional is None:
            provenance.provisional = "the cache cannot be written"
    else:
        summary.wrote(choice.path)


def obtain(choice: MeasuredChoice[R], *, fresh: bool = False, budget: clock.Budget | None = None,
           announce: bool = True) -> R:
    """The choice's answer on this machine: its entry, else measured (see the module's text).
    `fresh` measures again whatever the entry says, within `budget` (`mars tune` passes an
    unbounded one). `announce`: a result measured now, or provisional, is announced: its one
    note, or within a session a record for the session's one line (summary.py)."""
    with clock.TALLY.counting():
        return _obtain(choice, fresh, budget or clock.BUDGET, announce)


def _obtain(choice: MeasuredChoice[R], fresh: bool, budget: clock.Budget, announce: bool) -> R:
    cached = None if fresh else read(choice)
    if cached is not None and not due(cached) and (choice.complete(cached) or cached.provenance.provisional is not None):
        if cached.provenance.provisional is not None:  # a provisional entry: said once per process
            _announce(choice, cached, announce, had_entry=True, once=True)
        return cached
    waiting = (lambda: notes.note(f"another mars process is running the {choice.what}; waiting for it "
                                  f"(at most {min(LOCK_WAIT_S, max(budget.left, 0)):.0f} s)")) if announce else None
    with store.EntryLock(choice.path, min(LOCK_WAIT_S, max(budget.left, 0.0)), waiting) as lock:
        if not lock.acquired:
            result = cached or choice.fallback("another mars process was still measuring it")
            _announce(choice, result, announce, had_entry=cached is not None)
            return result
        if not fresh:  # measured by another process while this one waited?
            again = read(choice)
            if again is not None and not due(again) and (choice.complete(again) or again.provenance.provisional is not None):
                return again
            cached = again or cached
        busy = machine.busy_reason()  # before measuring: the measuring itself loads the machine
        if budget.spent and cached is not None:  # due, but nothing left to measure it with: as it is
            return cached
        if budget.spent:
            result = choice.fallback("not measured: this process's measuring budget was spent")
        else:
            with budget.spending() as deadline:
                result = choice.measure(deadline(choice.budget_s), cached)
        provenance: Provenance = result.provenance  # type: ignore[attr-defined]
        provenance.provisional = busy or provenance.provisional
        provenance.measured_at, provenance.busy = clock.wall(), busy is not None
        if provenance.provisional is not None and cached is not None and cached.provenance.provisional is not None:
            provenance.attempts = cached.provenance.attempts + 1  # type: ignore[attr-defined]
        if cached is not None and not fresh and not choice.replaces(result, cached):
            result = _kept(cached, provenance)
        save(choice, result)
    _announce(choice, result, announce, had_entry=cached is not None)
    return result


def _kept(previous: R, attempt: Provenance) -> R:
    """`previous`, kept over a re-measurement that may not replace it, dated by that attempt: it
    stays provisional (a settled entry turned provisional by drift keeps its reason) and is measured
    again when a provisional entry would be, never by cutting a user's run past its budget."""
    provenance: Provenance = previous.provenance  # type: ignore[attr-defined]
    provenance.provisional = provenance.provisional or attempt.provisional
    provenance.measured_at, provenance.busy, provenance.attempts = attempt.measured_at, attempt.busy, attempt.attempts
    provenance.cached = False  # this run measured (and kept what it had)
    return previous


def _announce(choice: MeasuredChoice, result: object, announce: bool, had_entry: bool, once: bool = False) -> None:
    """A result measured now, or provisional: its note, or a record for the session's one line."""
    if announce:
        path = choice.path
        summary.announce(summary.Record(choice.label or choice.what, choice.shown(result), choice.describe(result),
                                        result.provenance, path, summary.is_new(path, had_entry)),  # type: ignore[attr-defined]
                         once=once)


def announced(line: str, provenance: Provenance, scope: str) -> str:
    """A measured choice's note: `line`, then that it is settled (measured once per `scope`) or
    provisional, why, and when it is measured again."""
    if provenance.provisional is None:
        return f"{line}; measured once per {scope}, then cached"
    if provenance.busy or provenance.attempts >= QUIET_ATTEMPTS:
        when = f"once the machine is quiet and {RETRY_AFTER_S / 60:.0f} min have passed"
    else:
        when = "on the next run on a quiet machine"
    return f"{line}; provisional ({provenance.provisional}): measured again {when} (`mars tune` measures now)"


def mark_provisional(path: Path, why: str) -> bool:
    """Turn a settled entry provisional (drift.py: the machine no longer runs as it measured):
    still used, measured again on the next quiet run. Returns whether the entry was changed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("provisional") is not None:
            return False
        data.update(provisional=why, measured_at=clock.wall(), busy=False, attempts=1, stale=True)
        store.write_entry(path, json.dumps(data, indent=1))
    except (OSError, ValueError, TypeError, RecursionError):
        return False
    return True


# --------------------------------------------------------------------------- a reference against a candidate
@dataclass
class Verdict:
    """A reference (dense, the head's own weights) against a candidate (packed, int8 rows), timed
    interleaved: the candidate is used when its median block takes at most the preference's share
    of the reference's. Either median is None where the budget left it untimed (then: not used)."""

    used: bool
    reference_ms: float | None
    candidate_ms: float | None
    timed_twice: bool = False
    provenance: Provenance = field(default_factory=Provenance)


def decide(timed: Callable[[], dict[str, list[float]]], variants: tuple[str, str], repeats: int,
           preference: float) -> Verdict:
    """`timed()` (clock.time_interleaved over `variants`, reference first), once more on a close
    call (clock.close_call: the blocks pooled), decided; provisional where a variant got fewer
    blocks than asked."""
    blocks = timed()
    reference, candidate = clock.medians(blocks, variants)
    twice = bool(reference) and candidate is not None and clock.close_call(candidate / reference, preference)
    if twice:
        blocks = clock.pooled(blocks, timed())
        reference, candidate = clock.medians(blocks, variants)
    short = any(len(blocks.get(variant) or []) < repeats * (1 + twice) for variant in variants)
    used = reference is not None and candidate is not None and candidate <= preference * reference
    return Verdict(used, reference, candidate, twice,
                   Provenance(provisional="the measuring ran out of its budget" if short else None))


def read_verdict(data: dict, fields: tuple[str, str, str], preference: float) -> Verdict | None:
    """The verdict an entry records under `fields` (used, reference ms, candidate ms), or None when
    a time is implausible or the verdict contradicts its times; one with a variant untimed only
    as a provisional "not used"."""
    used, reference, candidate = (data[name] for name in fields)
    if not isinstance(used, bool) or not store.plausible_times(*(ms for ms in (reference, candidate) if ms is not None)):
        return None
    if reference is None or candidate is None:
        valid = not used and data.get("provisional") is not None
    else:
        valid = used == (candidate <= preference * reference)
    twice = data.get("timed_twice") is True
    return Verdict(used, store.number(reference), store.number(candidate), twice) if valid else None
