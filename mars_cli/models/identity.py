"""What a file's identity can answer, remembered: a value computed from files (a sha256, a model
fingerprint, "this cache entry's hashes matched") is stored under `<cache>/identity/`, keyed by the
files' paths, sizes, modification times and inodes, and computed again only when one of those
changes. A start-up then stats files instead of reading them."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from ..paths import cache_dir

FOLDER = "identity"
FORMAT = 1


def stamp(paths: list[Path]) -> list[list]:
    """Each file's (path, size, mtime in ns, inode, ctime in ns): what changes when its bytes do."""
    stamped = []
    for path in paths:
        info = os.stat(path)
        stamped.append([str(Path(path).resolve()), info.st_size, info.st_mtime_ns, info.st_ino, info.st_ctime_ns])
    return stamped


def remembered(kind: str, paths: list[Path], compute: Callable[[], str]) -> str:
    """`compute()`, or the value it gave last time for these files as they are now."""
    try:
        key = json.dumps([FORMAT, kind, stamp(sorted(paths))])
    except OSError:
        return compute()
    entry = cache_dir() / FOLDER / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    try:
        stored = json.loads(entry.read_text())
        if isinstance(stored, dict) and stored.get("key") == key and isinstance(stored.get("value"), str):
            return stored["value"]
    except (OSError, ValueError):
        pass
    value = compute()
    _store(entry, {"key": key, "value": value})
    return value


def _store(entry: Path, data: dict) -> None:
    """Written whole (a temporary file, then a rename); a cache that cannot be written is skipped."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        temporary = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
        temporary.write_text(json.dumps(data))
        os.replace(temporary, entry)
    except OSError:
        pass


def file_sha256(path: Path) -> str:
    """The file's sha256, read once after each change."""
    return remembered("sha256", [path], lambda: _sha256(path))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
