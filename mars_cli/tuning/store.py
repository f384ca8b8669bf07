"""The measurements' store: one JSON file per key under `<cache>/<folder>/`, written atomically,
measured by one process at a time under a lock beside it.

A file that does not parse, names another schema or key, or is a directory, is absent as far as
a reader knows: it is measured again, never trusted, and never a traceback. A cache that cannot
be written costs one note, not the run.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable

from .. import notes
from ..paths import cache_dir, write_atomic

ENTRY_ERRORS = (ValueError, TypeError, KeyError, AttributeError, RecursionError)  # a malformed entry's fields
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
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("schema") != schema or data.get("key") != key:
            return None
    except (OSError, ValueError, TypeError, RecursionError):
        return None
    return data


def write_entry(path: Path, text: str) -> Path:
    """Write an entry atomically; OSError when the cache cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
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
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = open(self.path, "a+b")
        except OSError:
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
