"""Which files a build read, by identity, so that a process that keeps what it built (the warm
server, warm/sessions.py) can tell whether a fresh process would build the same thing.

Loaders and the tuning layer call `read(path)` (or `read_folder` for a listing they searched)
as they read; while a `recording()` is open, each path's identity as first seen is kept: device,
inode, size and modification time, or None where the file was absent or unreadable (a file that
appears later, a `mars tune` entry or a user profile, is a change too). `changed` re-checks them
with one `os.stat` each. Outside a recording, `read` costs a list check. Imports nothing of
mars_cli: every layer may call it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Union

Identity = Union[tuple[int, int, int, int], None]  # (device, inode, size, mtime in ns); None: absent
Record = dict[str, Identity]

_OPEN: list[tuple[Record, bool]] = []  # the recordings under way, each with whether it takes writes


def identity(path: str | os.PathLike) -> Identity:
    """What changes when a file is replaced, truncated, rewritten or deleted."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def read(path: str | os.PathLike) -> None:
    """`path` was read, or looked for, now: every open recording keeps its first identity."""
    if not _OPEN:
        return
    name = os.path.abspath(os.fspath(path))
    seen = identity(name)
    for record, _ in _OPEN:
        record.setdefault(name, seen)


def wrote(path: str | os.PathLike) -> None:
    """`path` was written now (a measurement cached): recordings that take writes (a build's) keep
    its new identity, since a fresh process would read what the build wrote; the others keep what
    they saw first, so that a later change of an entry read before is a change."""
    if not _OPEN:
        return
    name = os.path.abspath(os.fspath(path))
    now = identity(name)
    for record, writes in _OPEN:
        if writes:
            record[name] = now


def read_folder(path: str | os.PathLike, depth: int = 1) -> None:
    """A folder searched or loaded whole: itself (its mtime changes when an entry is added, removed
    or renamed) and its entries, folders among them to `depth` levels."""
    if not _OPEN:
        return
    read(path)
    if depth <= 0:
        return
    try:
        entries = sorted(os.scandir(path), key=lambda entry: entry.name)
    except OSError:
        return
    for entry in entries:
        if entry.is_dir():
            read_folder(entry.path, depth - 1)
        else:
            read(entry.path)


def read_path(path: str | os.PathLike, depth: int = 1) -> None:
    """A file, or a folder with its entries: whichever `path` is now."""
    if not _OPEN:
        return
    if Path(path).is_dir():
        read_folder(path, depth)
    else:
        read(path)


@contextmanager
def recording(writes: bool = False) -> Iterator[Record]:
    """Keep the identities of what is read until the block ends (nested recordings each keep all);
    `writes`: and of what is written (`wrote`)."""
    record: Record = {}
    _OPEN.append((record, writes))
    try:
        yield record
    finally:
        _OPEN[:] = [entry for entry in _OPEN if entry[0] is not record]  # by identity: equal dicts are not it


def changed(record: Record) -> list[str]:
    """The recorded paths whose identity is not what it was when first read."""
    return [name for name, seen in list(record.items()) if identity(name) != seen]  # (another thread may add)
