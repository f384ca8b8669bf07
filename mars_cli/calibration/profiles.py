"""Calibration profiles: a versioned YAML schema, safe loading with validation, atomic saving,
lookup by model fingerprint (user directory first, then the profiles shipped with mars), and the
threshold a decoding session takes from them (`resolve_threshold`).

Schema 2 adds `modes`: thresholds per decoding mode (`greedy` for T = 0, `sampled` for T > 0),
each fitted on the positions that mode visits, with the quality sweep that chose it when the
objective was `quality=`. The top-level `thresholds`/`temperature`/`objective` stay (the sampled
mode's, else the greedy one's), so a schema-1 file is a profile with one mode: its temperature
says which (sampled at T = 1 for every profile made before modes existed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..decoding.rules import MARGIN_MEASURES
from ..decoding.sampling import SamplingParams
from ..decoding.verifiers import DEFAULT_THRESHOLD
from .. import reads
from ..errors import UserError
from ..notes import note
from ..paths import user_profile_dir, write_atomic

if TYPE_CHECKING:
    from ..models import LoadedModel
    from ..options import DecodingOptions

SCHEMA_VERSION = 2
SUPPORTED_SCHEMAS = (1, 2)
MODES = ("greedy", "sampled")
SHIPPED_DIR = Path(__file__).parent.parent / "profiles"
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

    def modes(self) -> dict[str, dict[str, Any]]:
        """Mode name -> its block (thresholds, temperature, objective, ...). A file without `modes`
        (schema 1) has one mode, named by its temperature."""
        if "modes" in self.data:
            return self.data["modes"]
        top = {key: self.data[key] for key in ("thresholds", "temperature", "objective")}
        return {mode_of(self.data["temperature"]): top}

    def mode_for(self, temperature: float) -> ModeChoice:
        """The block for decoding at `temperature`; the other mode when this profile lacks it."""
        wanted = mode_of(temperature)
        modes = self.modes()
        if wanted in modes:
            return ModeChoice(wanted, modes[wanted], None)
        other = next(iter(modes))
        what = "greedy (T = 0)" if wanted == "greedy" else "sampling (T > 0)"
        note = (f"profile {self.path} has no thresholds for {what}; using its {other} ones "
                f"(recalibrate with `mars calibrate --modes greedy,sampled` for both)")
        return ModeChoice(other, modes[other], note)


@dataclass(frozen=True)
class ModeChoice:
    """The mode a decoding temperature asks for, as found in a profile (`note`: why another)."""

    name: str
    block: dict[str, Any]
    note: str | None


def mode_of(temperature: float) -> str:
    """Greedy decoding (T = 0, or below sampling.GREEDY_BELOW, which decodes as 0) visits other
    positions than sampling does: its own thresholds."""
    return "greedy" if SamplingParams(temperature).greedy else "sampled"


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
    if data["schema"] not in SUPPORTED_SCHEMAS:
        raise fail(f"schema version {data['schema']} is not supported (expected "
                   f"{' or '.join(map(str, SUPPORTED_SCHEMAS))})")
    for key, kind in REQUIRED_MODEL.items():
        if not isinstance(data["model"].get(key), kind):
            raise fail(f"missing or malformed field 'model.{key}'")
    _check_thresholds(data["thresholds"], "", fail)
    if not math.isfinite(data["temperature"]) or data["temperature"] < 0:
        raise fail("temperature must be >= 0")
    if "modes" in data:
        _check_modes(data["modes"], fail)
    return data


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_thresholds(thresholds: object, where: str, fail) -> None:
    if not isinstance(thresholds, dict) or not thresholds:
        raise fail(f"no thresholds{where}")
    for measure, value in thresholds.items():
        if measure not in MARGIN_MEASURES:
            raise fail(f"unknown margin measure '{measure}'{where}")
        if not _is_number(value) or not 0 < value <= 1:
            raise fail(f"threshold for {measure}{where} must be a number in (0, 1], got {value!r}")


def _check_modes(modes: object, fail) -> None:
    """Each mode: thresholds as at the top level, a temperature that fits its name, and when a
    sweep is stored, rows with a theta in (0, 1] and a tau."""
    if not isinstance(modes, dict) or not modes:
        raise fail("field 'modes' must be a mapping of greedy and/or sampled")
    for name, block in modes.items():
        where = f" (mode {name})"
        if name not in MODES:
            raise fail(f"unknown mode '{name}' (expected {' or '.join(MODES)})")
        if not isinstance(block, dict):
            raise fail(f"mode {name} must be a mapping")
        _check_thresholds(block.get("thresholds"), where, fail)
        temperature = block.get("temperature")
        if not _is_number(temperature) or (temperature == 0) != (name == "greedy") or temperature < 0:
            raise fail(f"mode {name} needs a temperature {'of 0' if name == 'greedy' else '> 0'}")
        sweep = block.get("sweep")
        if sweep is None:
            continue
        rows = sweep.get("rows") if isinstance(sweep, dict) else None
        if not isinstance(rows, list) or not all(
                isinstance(row, dict) and _is_number(row.get("theta")) and 0 < row["theta"] <= 1
                and _is_number(row.get("tau")) for row in rows):
            raise fail(f"the sweep of mode {name} needs rows with a theta in (0, 1] and a tau")


def load(path: str | Path) -> Profile:
    """Read and validate a profile; a file over PROFILE_LIMIT (a real one is a few KiB) is refused
    unread, since YAML parsing of 100 MB took minutes."""
    from ..inputs import PROFILE_LIMIT, read_text

    path = Path(path)
    reads.read(path)  # a warm server's session is rebuilt when it changes (reads.py)
    text = read_text(path, "profile", PROFILE_LIMIT)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UserError(f"invalid profile {path}: not valid YAML{where}") from None
    except RecursionError:
        raise UserError(f"invalid profile {path}: not valid YAML (nested too deeply)") from None
    return Profile(path, validate(data, str(path)))


class _PlainDumper(yaml.SafeDumper):
    """Safe YAML without anchors and aliases: a block shared twice (the sampled mode's thresholds
    at the top level too) is written out twice, so the file reads plainly."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def save(profile_data: dict[str, Any], path: str | Path) -> Path:
    """Write atomically (temporary file, then rename): a killed process never leaves a
    half-written profile behind."""
    validate(profile_data, str(path))
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, yaml.dump(profile_data, Dumper=_PlainDumper, sort_keys=False, allow_unicode=True,
                                     width=100))
    except OSError as exc:
        raise UserError(f"cannot write profile {path}: {exc.strerror or exc}") from None
    return path


def search_dirs() -> list[Path]:
    return [user_profile_dir(), SHIPPED_DIR]


def find_for(fingerprint: str) -> Profile | None:
    """The first profile whose fingerprint matches, user directory before shipped profiles.
    Files that do not parse are skipped here (they are reported when named with --calibration)."""
    for directory in search_dirs():
        reads.read_folder(directory)  # a profile added, edited or removed later: a change
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


# --------------------------------------------------------------------------- temperature scale
def threshold_at_temperature(theta: float, measure: str, temperature: float) -> float:
    """Profiles store thresholds on the raw-logit scale (T = 1). The logit ratio is unchanged by
    temperature; the probability ratio at temperature T is (p2/p1 at T = 1) ** (1/T)."""
    if measure == "prob-ratio" and not SamplingParams(temperature).greedy:
        return theta ** (1.0 / temperature)
    return theta


def to_raw(theta: float, measure: str, temperature: float) -> float:
    """A prob-ratio theta applied at temperature T is theta ** T on the raw (T = 1) scale that
    profiles hold (the inverse of `threshold_at_temperature`)."""
    if measure == "prob-ratio" and not SamplingParams(temperature).greedy:
        return theta ** temperature
    return theta


# --------------------------------------------------------------------------- the threshold in use
@dataclass
class ResolvedThreshold:
    """The theta a session decodes with and where it came from (reported by --json and --stats)."""

    value: float
    source: str  # "flag", "default" or the profile file's path


def resolve_threshold(options: DecodingOptions, target: LoadedModel) -> ResolvedThreshold:
    """--threshold wins; then --calibration; then a profile matching the target's fingerprint
    (user directory, then shipped); then the paper's 0.9. From a profile, the thresholds of the
    mode that matches the temperature (greedy for T = 0, sampled otherwise; the other one with a
    note when it has only one), held on the raw scale and converted to the temperature in use."""
    verification = options.verification
    if verification.threshold is not None:
        return ResolvedThreshold(verification.threshold, "flag")
    if verification.calibration is not None:
        profile = load(verification.calibration)
        check_matches(profile, target.fingerprint, target.spec, verification.force)
    elif verification.verify == "mars":
        profile = find_for(target.fingerprint)
    else:
        profile = None
    if profile is None:
        return ResolvedThreshold(DEFAULT_THRESHOLD, "default")
    temperature = options.sampling.temperature
    theta = threshold_at_temperature(raw_threshold(profile, verification.margin, temperature), verification.margin,
                                     temperature)
    if theta >= 1:  # neither measure exceeds 1: no position is low-margin, so nothing is relaxed
        note(f"profile {profile.path.name}: its {profile.mode_for(temperature).name} fit kept quality only without "
             f"relaxing (theta 1), so MARS verifies as --verify strict does; --threshold below 1 relaxes anyway "
             f"(`mars calibrate --replot {profile.path} --plot sweep.png` draws what each theta did)", once=True)
    return ResolvedThreshold(theta, str(profile.path))


def raw_threshold(profile: Profile, measure: str, temperature: float) -> float:
    """The profile's theta for `measure` on the raw-logit scale, from the mode that decoding at
    `temperature` visits (greedy for T = 0, sampled otherwise; the other one, with a note, when
    the profile has only one); a quality= fit of one measure lends the other its loss bound."""
    choice = profile.mode_for(temperature)
    if choice.note is not None:
        note(choice.note, once=True)  # never silently; once, though eval builds many sessions
    thresholds = choice.block["thresholds"]
    if measure not in thresholds:
        bound = (choice.block.get("loss_bound") or {}).get("thresholds") or {}
        if measure not in bound:
            raise UserError(f"profile {profile.path} has no {choice.name} threshold for --margin {measure}")
        note(f"profile {profile.path.name} fitted {choice.name} quality on "
             f"{', '.join(thresholds)} only; --margin {measure} uses its loss bound", once=True)
        thresholds = bound
    return float(thresholds[measure])
