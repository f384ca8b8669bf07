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


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary sibling, then rename: a killed process never leaves a half-written
    file that a later run would take for a whole one."""
    handle, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
