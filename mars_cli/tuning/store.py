"""The measurements' store: one JSON file per key under `<cache>/<folder>/`, written atomically,
measured by one process at a time under a lock beside it.

A file that does not parse, names another schema or key, or is a directory, is absent as far as
a reader knows: it is measured again, never trusted, and never a traceback. A cache that cannot
be written costs one note, not the run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Callable

from .. import notes, reads
from ..paths import cache_dir, open_lock, write_atomic

# a malformed entry's fields (OverflowError: a huge integer or Infinity where a number belongs)
ENTRY_ERRORS = (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError)
MAX_DIGITS = 15  # an integer in an entry (a date, a count, a timing) has fewer digits
# a recorded time outside these is nonsense: measured again
MIN_PLAUSIBLE_MS, MAX_PLAUSIBLE_MS = 1e-3, 60_000.0
LOCK_POLL_S = 0.1


def cache_path(key: dict, folder: str) -> Path:
    """The entry for `key`: `<cache>/<folder>/<hash of the key>.json`."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / folder / f"{digest}.json"


def read_entry(path: Path, schema: int, key: dict) -> dict | None:
    """An entry's JSON object when it parses, has this `schema` and was measured for `key`; None
    when absent, unreadable, malformed or stale. The caller checks the fields it reads (any of
    ENTRY_ERRORS raised while it does means the same)."""
    reads.read(path)  # what a warm server's session was built from (reads.py)
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_not_finite, parse_int=_bounded_int,
                          parse_float=_finite_float)
        if not isinstance(data, dict) or data.get("schema") != schema or data.get("key") != key:
            return None
    except (OSError, ValueError, TypeError, RecursionError, OverflowError):
        return None
    return data


def _not_finite(name: str) -> float:
    """NaN and Infinity are no measurement (an entry of `"attempts": Infinity` crashed every command)."""
    raise ValueError(f"{name} in a tuning entry")


def _bounded_int(text: str) -> int:
    """An integer of at most MAX_DIGITS digits (a 400-digit `measured_at` overflowed every command)."""
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError("an integer too long for a tuning entry")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} overflows a float")
    return value


def write_entry(path: Path, text: str) -> Path:
    """Write an entry atomically; OSError when the cache cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    reads.wrote(path)
    return path


def save_or_note(path: Path, text: str, what: str) -> bool:
    """Cache a measurement where the cache can be written; elsewhere go on without it and say so
    once. Returns whether it was written."""
    try:
        write_entry(path, text)
        return True
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        notes.note(f"cannot cache the {what} at {path} ({reason}); decoding without caching it (the next run "
                   "measures it again)", once=True)
        return False


def plausible_times(*times: object) -> bool:
    """Whether every recorded time is a number a real measurement could give."""
    return all(isinstance(ms, (int, float)) and not isinstance(ms, bool) and MIN_PLAUSIBLE_MS <= ms <= MAX_PLAUSIBLE_MS
               for ms in times)


def number(value: object) -> float | None:
    """A recorded number (None stays None); ValueError for anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"not a number: {value!r}")
    return float(value)


class EntryLock:
    """An exclusive flock on `<entry>.lock`, so that one process at a time measures an entry (two
    measuring at once each time the other's load), polled until `wait_s` has passed. Kept after
    use (unlinking a lock file races with its next user); the kernel drops it when its holder
    dies. Where no lock file can be made there is nothing to share either: `acquired` is True."""

    def __init__(self, entry: Path, wait_s: float, waiting: Callable[[], None] | None = None) -> None:
        self.path = entry.with_name(entry.name + ".lock")
        self.wait_s, self.waiting = wait_s, waiting
        self.handle = None
        self.acquired = False

    def __enter__(self) -> "EntryLock":
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on POSIX
            self.acquired = True
            return self
        try:  # never through a link (one planted there made the lock a file at its target)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = os.fdopen(open_lock(self.path), "r+b")
        except OSError:  # a planted link or FIFO (PlantedLock) too: nothing made there, nothing shared
            self.acquired = True
            return self
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.acquired = True
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return self
            if self.waiting is not None:
                self.waiting()
                self.waiting = None
            time.sleep(LOCK_POLL_S)

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.close()  # closing releases the lock
