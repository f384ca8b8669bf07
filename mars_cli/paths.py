"""Where mars-cli keeps files on the user's machine (caches and user profiles)."""

from __future__ import annotations

import os
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
