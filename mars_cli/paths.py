"""Where mars-cli keeps files on the user's machine, and how it writes them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


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
