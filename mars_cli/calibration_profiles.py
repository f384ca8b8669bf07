"""Calibration profiles: a versioned YAML schema, safe loading with validation, atomic saving,
and lookup by model fingerprint (user directory first, then the profiles shipped with mars)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .decoding.verifiers import MARGIN_MEASURES
from .errors import UserError
from .paths import user_profile_dir, write_atomic

SCHEMA_VERSION = 1
SHIPPED_DIR = Path(__file__).parent / "profiles"
REQUIRED = {
    "schema": int,
    "model": dict,
    "thresholds": dict,
    "temperature": (int, float),
    "objective": dict,
    "samples": int,
    "prompt_set": dict,
    "quantiles": dict,
    "tool_version": str,
    "created": str,
    "command": str,
}
REQUIRED_MODEL = {"name": str, "source": str, "fingerprint": str, "vocab_size": int}


@dataclass
class Profile:
    path: Path | None
    data: dict[str, Any]

    @property
    def fingerprint(self) -> str:
        return self.data["model"]["fingerprint"]

    def threshold(self, measure: str) -> float:
        return float(self.data["thresholds"][measure])


def validate(data: object, origin: str) -> dict[str, Any]:
    """Raise a one-line UserError naming the first problem; return the data when sound."""
    def fail(problem: str) -> UserError:
        return UserError(f"invalid profile {origin}: {problem}")

    if not isinstance(data, dict):
        raise fail("expected a YAML mapping at the top level")
    for key, kind in REQUIRED.items():
        if key not in data:
            raise fail(f"missing field '{key}'")
        if not isinstance(data[key], kind) or isinstance(data[key], bool):
            raise fail(f"field '{key}' has the wrong type")
    if data["schema"] != SCHEMA_VERSION:
        raise fail(f"schema version {data['schema']} is not supported (expected {SCHEMA_VERSION})")
    for key, kind in REQUIRED_MODEL.items():
        if not isinstance(data["model"].get(key), kind):
            raise fail(f"missing or malformed field 'model.{key}'")
    thresholds = data["thresholds"]
    if not thresholds:
        raise fail("no thresholds")
    for measure, value in thresholds.items():
        if measure not in MARGIN_MEASURES:
            raise fail(f"unknown margin measure '{measure}'")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                or not 0 < value <= 1:
            raise fail(f"threshold for {measure} must be a number in (0, 1], got {value!r}")
    if not math.isfinite(data["temperature"]) or data["temperature"] < 0:
        raise fail("temperature must be >= 0")
    return data


def load(path: str | Path) -> Profile:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"profile not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read profile {path}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UserError(f"invalid profile {path}: not valid YAML{where}") from None
    return Profile(path, validate(data, str(path)))


def save(profile_data: dict[str, Any], path: str | Path) -> Path:
    """Write atomically (temporary file, then rename): a killed process never leaves a
    half-written profile behind."""
    validate(profile_data, str(path))
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, yaml.safe_dump(profile_data, sort_keys=False, allow_unicode=True, width=100))
    except OSError as exc:
        raise UserError(f"cannot write profile {path}: {exc.strerror or exc}") from None
    return path


def search_dirs() -> list[Path]:
    return [user_profile_dir(), SHIPPED_DIR]


def find_for(fingerprint: str) -> Profile | None:
    """The first profile whose fingerprint matches, user directory before shipped profiles.
    Files that do not parse are skipped here (they are reported when named with --calibration)."""
    for directory in search_dirs():
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.yaml")):
            try:
                profile = load(path)
            except UserError:
                continue
            if profile.fingerprint == fingerprint:
                return profile
    return None


def check_matches(profile: Profile, fingerprint: str, model_name: str, force: bool) -> None:
    if profile.fingerprint == fingerprint or force:
        return
    calibrated_for = profile.data["model"]["name"]
    if calibrated_for == model_name:  # same name, other weights or tokenizer: say so, not "X, not X"
        raise UserError(
            f"profile {profile.path} was calibrated for a different {model_name!r} (other weights or tokenizer: "
            f"fingerprint {profile.fingerprint[:12]}, this model's {fingerprint[:12]}; pass --force to use it anyway)")
    raise UserError(f"profile {profile.path} was calibrated for {calibrated_for!r}, not for {model_name!r} "
                    "(pass --force to use it anyway)")


def threshold_at_temperature(theta: float, measure: str, temperature: float) -> float:
    """Profiles store thresholds on the raw-logit scale (T = 1). The logit ratio is unchanged by
    temperature; the probability ratio at temperature T is (p2/p1 at T = 1) ** (1/T)."""
    if measure == "prob-ratio" and temperature > 0:
        return theta ** (1.0 / temperature)
    return theta
