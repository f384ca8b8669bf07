"""Reading the files a user names (eval suites, prompt sets, profiles, resume logs): one sentence
for each way a file can be unusable (missing, a directory, a FIFO or device that would block or
never end, too large, not UTF-8), checked before its contents are trusted, so none of them
becomes a traceback, a hang or minutes of parsing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import UserError

MiB = 1 << 20
PROFILE_LIMIT = 4 * MiB  # a real profile is a few KiB; a 100 MB one took minutes to parse
JSONL_LIMIT = 256 * MiB  # suites and prompt sets: far beyond any real one, still readable at once
LOG_LIMIT = 256 * MiB  # resume files mars wrote itself (run.json, samples.jsonl, .partial.json)


def _size(count: int) -> str:
    return f"{count // MiB} MiB" if count and count % MiB == 0 else f"{count:,} bytes"


def check_file(path: Path, what: str, limit: int, missing: str | None = None) -> None:
    """Refuse, without opening it, a file that is missing, a directory, not a regular file or
    larger than `limit`. `missing` replaces the message for a file that does not exist (some
    callers have said it their own way for long)."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise UserError(missing or f"{what} not found: {path}") from None
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise UserError(f"{what} {path} is a directory; name a file")
    if not stat.S_ISREG(info.st_mode):  # a FIFO blocks, a device never ends: never opened
        raise UserError(f"{what} {path} is not a regular file")
    if info.st_size > limit:
        raise UserError(f"{what} {path} is too large ({info.st_size:,} bytes; the limit is {_size(limit)})")


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words ("a FIFO", "a directory", ...)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def read_at_most(path: Path, limit: int) -> tuple[bytes, int]:
    """(up to `limit` + 1 bytes of `path`, the opened file's mode; nothing read unless it is a
    regular file). Opened non-blocking and checked on the descriptor: a file swapped for a FIFO
    after a caller's check cannot hang the read. OSError as the system raises it."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        return (handle.read(limit + 1) if stat.S_ISREG(mode) else b""), mode


def read_bytes(path: Path, what: str, limit: int, missing: str | None = None) -> bytes:
    """The whole file, or a UserError naming `what` and the problem (see `check_file`)."""
    path = Path(path)
    check_file(path, what, limit, missing)
    try:
        data, mode = read_at_most(path, limit)
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{what} {path} is not a regular file")
    if len(data) > limit:  # it grew after the check
        raise UserError(f"{what} {path} is too large (over {_size(limit)})")
    return data


def decode_utf8(data: bytes, path: Path, what: str) -> str:
    """`data` as text, or one sentence giving the offset of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {path} is not valid UTF-8 (byte {exc.start})") from None


def read_text(path: Path, what: str, limit: int, missing: str | None = None) -> str:
    """`read_bytes`, decoded as UTF-8."""
    return decode_utf8(read_bytes(path, what, limit, missing), Path(path), what)
