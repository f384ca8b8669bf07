"""Where mars-cli keeps files on the user's machine, and how it writes them."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterator

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # what a full disk (or a spent quota) raises


def cache_dir() -> Path:
    """Root for converted models and other caches: $MARS_CACHE, else the user cache dir."""
    override = os.environ.get("MARS_CACHE")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mars-cli"


def user_profile_dir() -> Path:
    """User profiles are searched before the shipped ones: $MARS_PROFILES or ~/.config."""
    override = os.environ.get("MARS_PROFILES")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "mars-cli" / "profiles"


def user_head_dir() -> Path:
    """Trained draft heads: $MARS_HEADS, else the user data dir; searched before shipped ones."""
    override = os.environ.get("MARS_HEADS")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "mars-cli" / "heads"


def create_directory(directory: Path) -> None:
    """Create an output directory named by the user: its last level only, so that a typo in a
    parent never builds a tree up from the filesystem root. Inside mars's own directories
    (profiles, heads, cache) every missing level is created."""
    from .errors import UserError

    if directory.is_dir():
        return
    own = any(base == directory or base in directory.parents
              for base in (user_profile_dir(), user_head_dir(), cache_dir()))
    try:
        directory.mkdir(parents=own, exist_ok=True)
    except FileNotFoundError:
        if directory.parent.is_dir():  # /proc, /sys: the parent is there but takes no new entries
            raise UserError(f"cannot create {directory}: {directory.parent} does not accept new files or "
                            "directories") from None
        raise UserError(f"cannot create {directory}: {directory.parent} does not exist (only the last level "
                        "of an output path is created; create the rest first)") from None
    except OSError as exc:
        raise UserError(f"cannot create {directory}: {exc.strerror or exc}") from None


def default_mode(path: Path) -> int:
    """The mode a plain `open(path, "w")` would give: the existing file's, else 0666 less the umask."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0o022)
        os.umask(mask)
        return 0o666 & ~mask


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary sibling, then rename: a killed process never leaves a half-written
    file that a later run would take for a whole one. The file gets the usual mode (mkstemp's
    0600 would hide it from the user's group where its siblings are readable)."""
    handle, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(handle, default_mode(path))
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException as exc:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            raise disk_full(path, exc) from None
        raise


def disk_full(path: Path, error: BaseException):
    """The one line for a write that found no space: which file, and that nothing before it is lost."""
    from .errors import UserError

    reason = getattr(error, "strerror", None) or os.strerror(errno.ENOSPC)
    return UserError(f"cannot write {path}: {reason} (free some space there or write elsewhere; "
                     "what was written before is kept)")


def _out_of_space(error: BaseException, folder: Path) -> bool:
    """Whether a failed write failed for want of space: ENOSPC/EDQUOT, or (torch and safetensors
    report it in their own words) any error while the folder's file system has under 1 MiB free."""
    if isinstance(error, OSError) and error.errno in DISK_FULL:
        return True
    if not isinstance(error, Exception):
        return False
    try:
        status = os.statvfs(folder)
    except OSError:
        return False
    return status.f_bavail * status.f_frsize < 1 << 20


@contextlib.contextmanager
def saving(path: Path, temporary: Path) -> Iterator[None]:
    """Around the writing of `temporary` (renamed to `path` afterwards by the caller): on failure
    the temporary goes, and a full disk becomes one line naming `path` (the earlier file stays)."""
    try:
        yield
    except BaseException as exc:
        temporary.unlink(missing_ok=True)
        if _out_of_space(exc, temporary.parent):
            raise disk_full(path, exc) from None
        raise


def remove_leftovers(path: Path) -> int:
    """Delete the temporaries write_atomic left beside `path` when a process writing it was killed
    (call with the output claimed: no live writer owns them). Returns how many there were."""
    removed = 0
    for leftover in [*path.parent.glob(f"{path.name}.*.tmp"), path.with_name(path.name + ".tmp")]:
        if not leftover.is_file():
            continue
        try:
            leftover.unlink()
            removed += 1
        except OSError:
            continue
    return removed


def check_can_create(directory: Path, what: Path) -> None:
    """Create (and remove) a file in `directory`: the permission bits say yes for root in /proc
    and on read-only mounts, so only trying tells, and before minutes of work, not after."""
    import tempfile

    from .errors import UserError

    try:
        tempfile.NamedTemporaryFile(dir=directory, prefix=".mars-probe-").close()  # created, then removed
    except FileNotFoundError:
        raise UserError(f"cannot write {what}: {directory} does not accept new files") from None
    except OSError as exc:
        raise UserError(f"cannot write {what}: {exc.strerror or exc}") from None


def locks_dir() -> Path:
    """`$MARS_CACHE/locks`, where output and conversion locks live: a directory of this user's
    that no one else can write (made 0700; one that is a link, or not this user's, is refused:
    another user could plant a link there named like the next lock)."""
    from .errors import UserError

    folder = cache_dir() / "locks"
    create_directory(cache_dir())
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UserError(f"cannot create {folder}: {exc.strerror or exc}") from None
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode):
        raise UserError(f"{folder} is {'a symbolic link' if stat.S_ISLNK(found.st_mode) else 'not a directory'}: "
                        "mars keeps its locks there; remove it")
    if hasattr(os, "geteuid") and found.st_uid != os.geteuid():
        raise UserError(f"{folder} belongs to another user (uid {found.st_uid}): mars keeps its locks in a folder "
                        "only you can write; remove it or point MARS_CACHE elsewhere")
    if found.st_mode & 0o022:
        os.chmod(folder, stat.S_IMODE(found.st_mode) & ~0o022)  # ours: writable by us alone
    return folder


class PlantedLock(OSError):
    """A lock's path is a link or something other than a regular file: not made by mars."""


def open_lock(path: Path) -> int:
    """A lock file's descriptor, opened read-write and created 0600 if missing, without following
    a link at `path` (a planted link made the output lock overwrite the file it pointed to) and
    without blocking on a FIFO. PlantedLock for a link, a non-regular file or one with other
    names (hard links); OSError for anything else."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
        | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        handle = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise PlantedLock(errno.ELOOP, f"{path} is a symbolic link, not a lock mars made") from None
        raise
    found = os.fstat(handle)
    if not stat.S_ISREG(found.st_mode) or found.st_nlink > 1:
        os.close(handle)
        what = "not a regular file" if not stat.S_ISREG(found.st_mode) else "a file with other names (hard links)"
        raise PlantedLock(errno.EEXIST, f"{path} is {what}, not a lock mars made")
    os.set_blocking(handle, True)
    return handle


_claimed: dict[str, object] = {}  # output locks this process holds, by lock path (released as a command ends)


def claim_output(path: Path, command: str) -> None:
    """Hold, until the command ends (cli.main releases it) or the process dies, an exclusive lock
    on an output (a run directory, a profile, a head), so that two mars processes never write the
    same one: the second stops in one line naming the first. The lock file lives under
    $MARS_CACHE/locks (nothing is left beside the user's files), and the kernel drops the lock
    when its holder dies, even by kill -9."""
    import hashlib

    from .errors import UserError

    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        return
    key = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:24]
    lock_path = cache_dir() / "locks" / f"output-{key}.lock"
    if str(lock_path) in _claimed:
        return
    locks_dir()
    try:
        handle = os.fdopen(open_lock(lock_path), "r+", encoding="utf-8")
    except PlantedLock as exc:
        raise UserError(f"cannot claim {path}: {exc.strerror}; remove it") from None
    except OSError as exc:
        raise UserError(f"cannot claim {path}: cannot open its lock {lock_path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another mars process"
        handle.close()
        raise UserError(f"{path} is being written by {holder}: wait for it to finish, or pick another --out") \
            from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"mars {command} (pid {os.getpid()})")
    handle.flush()
    _claimed[str(lock_path)] = handle


def release_outputs() -> None:
    """Let go of every output this process claimed (at the end of a command)."""
    for handle in _claimed.values():
        handle.close()  # closing drops the flock
    _claimed.clear()
