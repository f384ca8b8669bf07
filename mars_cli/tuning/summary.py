"""One note for all that a session's tuning measured: a first run says in one line what it measured
and what stays provisional, not one two-line note per measured choice.

Inside `collecting()` (the session's construction and its first draft-length chooser, through
plan.py; `plan.settle_dtype` and `plan.settle_packing`) each announcement of choice.py's `obtain`
is recorded instead of printed; `flush()` (the session, when a decode starts) prints the records
gathered so far as one line, once per process (eval and calibrate build several sessions). The
per-choice lines stay in the records: `--json`'s `tuning.notes` (`details`). Outside a scope
(`mars tune`, a tool calling a choice directly) each announcement is its own note, as before.
Records no session flushes (a process that never decodes: `mars train-head`) are said at exit.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

from .. import notes

F = TypeVar("F", bound=Callable)


@dataclass
class Record:
    """One announcement: `label` and `value` for the summary ("dtype", "float32"), `detail` the
    choice's own line (`describe`), `provenance` None for a detail that decides nothing."""

    label: str
    value: str | None
    detail: str
    provenance: object | None  # choice.Provenance
    path: Path | None  # the entry it is about
    new: bool  # no entry existed before this process


class _State:
    def __init__(self) -> None:
        self.depth = 0  # collecting scopes open
        self.pending: list[Record] = []  # recorded, not yet summarised
        self.records: list[Record] = []  # every record of this process (details for --json)
        self.written: set[Path] = set()  # entries this process wrote
        self.said = False  # the summary line was printed
        self.session = False  # a session collected: it (or another) flushes, not the exit hook
        self.hooked = False


STATE = _State()
MOST_RECORDS = 200  # a long-lived process (the warm server) keeps only the latest


@contextmanager
def collecting(session: bool = False) -> Iterator[None]:
    """Record announcements instead of printing them; `session`: a session's scope (it flushes)."""
    state = STATE
    state.depth += 1
    state.session = state.session or session
    try:
        yield
    finally:
        state.depth -= 1


def collected(function: F) -> F:
    """A session method whose announcements are recorded (`collecting(session=True)`)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with collecting(session=True):
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def active() -> bool:
    return STATE.depth > 0


def wrote(path: Path) -> None:
    """`path` was written by this process (a later read of it is still this run's first measurement)."""
    STATE.written.add(path)


def is_new(path: Path | None, had_entry: bool) -> bool:
    return not had_entry or (path is not None and path in STATE.written)


def announce(record: Record, *, once: bool = False) -> None:
    """Record `record` inside a scope; print its detail outside one (`once`: once per process)."""
    state = STATE
    if not state.depth:
        notes.note(record.detail, once=once)
        return
    state.pending.append(record)
    state.records.append(record)
    del state.records[:-MOST_RECORDS]
    if not state.hooked:
        state.hooked = True
        atexit.register(_at_exit)


def flush() -> None:
    """Print the pending records' one line, unless this process said it already."""
    state = STATE
    text = line(state.pending)
    state.pending.clear()
    if text is not None and not state.said:
        state.said = True
        notes.note(text)


def _at_exit() -> None:
    if not STATE.session:  # a session flushes its own; what one left unflushed was never used
        flush()


def details(paths: Iterable[Path]) -> list[str]:
    """The per-choice lines this process recorded about the entries at `paths`, in order."""
    wanted = set(paths)
    found: list[str] = []
    for record in STATE.records:
        if record.path in wanted and record.detail not in found:
            found.append(record.detail)
    return found


def line(records: list[Record]) -> str | None:
    """The one line for `records`: what was measured now, what is provisional and why; None when
    nothing was measured or is provisional."""
    chosen: dict[str, Record] = {}
    first: dict[str, bool] = {}
    for record in records:
        if record.provenance is None:  # a detail: it may change what a choice recorded before decided
            if record.label in chosen and record.value is not None:
                chosen[record.label] = dataclasses.replace(chosen[record.label], value=record.value)
            continue
        first.setdefault(record.label, record.new)
        chosen.pop(record.label, None)
        chosen[record.label] = record  # the latest state of each, in the order they were last decided
    if not chosen:
        return None
    settled = [r for r in chosen.values() if r.provenance.provisional is None]  # type: ignore[union-attr]
    pending = [r for r in chosen.values() if r.provenance.provisional is not None]  # type: ignore[union-attr]
    head = "first run of this model on this machine" if all(first.values()) else "tuning for this machine"
    parts = []
    if settled:
        parts.append(f"measured {_items(settled)}" + ("" if pending else ", cached for later runs"))
    if pending:
        why = _reasons(pending)
        parts.append(f"{_items(pending)} provisional{f' ({why})' if why else ''}: measured on a later run on a "
                     f"quiet machine (`mars tune` measures {'it' if len(pending) == 1 else 'them'} now)")
    return f"{head}: " + "; ".join(parts)


def _items(records: list[Record]) -> str:
    names = [f"{r.label} ({r.value})" if r.value is not None else r.label for r in records]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _reasons(records: list[Record]) -> str | None:
    """Why they are provisional, when that fits the line (a busy machine said once)."""
    reasons: list[str] = []
    busy = False
    for record in records:
        provenance = record.provenance
        if provenance.busy and busy:  # type: ignore[union-attr]
            continue  # the load differs by a decimal from one choice to the next
        busy = busy or provenance.busy  # type: ignore[union-attr]
        if str(provenance.provisional) not in reasons:  # type: ignore[union-attr]
            reasons.append(str(provenance.provisional))  # type: ignore[union-attr]
    joined = "; ".join(reasons)
    return joined if len(joined) <= 120 else None
