"""What switches MARS on inside vLLM, and the thresholds it decodes with.

One key of vLLM's `additional_config`, the place vLLM keeps for plugins, in both of its entry
points:

    vllm serve MODEL --speculative-config '{...}' --additional-config '{"mars": {"profile": "auto"}}'
    LLM(MODEL, speculative_config={...}, additional_config={"mars": {"theta": 0.9}})

Keys of the "mars" mapping: `theta` (in (0, 1]: both modes; wins over a profile, as --threshold
does), `profile` (a calibration profile's path, or "auto": the profile matching the target's
fingerprint, user directory first, then the shipped ones), `measure` ("logit-ratio", the default,
or "prob-ratio") and `force` (use a profile calibrated for another model). Without `theta` or a
profile, "auto"; without a matching profile, the paper's 0.9.

Resolved once, in the process that builds vLLM's config; the resolved mapping (`RESOLVED`) is what
the engine's processes read, so no worker looks for profiles or fingerprints again. The marker is
not a pass: additional_config is user input, so a mapping that claims to be resolved is checked
again, field by field, wherever it is read (`checked`), and is worth no more than a "theta" would be.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..calibration import profiles
from ..decoding.rules import MARGIN_MEASURES
from ..decoding.verifiers import DEFAULT_THRESHOLD
from ..errors import UserError
from .rejection import Thresholds

if TYPE_CHECKING:
    from ..options import VerifyOptions

KEY = "mars"  # the additional_config key
KEYS = ("theta", "profile", "measure", "force")
RESOLVED = "resolved"  # marks a mapping this module wrote: measure, greedy, sampled, source
RESOLVED_KEYS = (RESOLVED, "measure", "greedy", "sampled", "source")


def resolve(config: object, model: str | Path, speculative: bool) -> dict[str, Any]:
    """The "mars" mapping a user wrote -> the resolved one. Raises a one-line UserError that
    names the fix for anything unusable."""
    if not isinstance(config, Mapping):
        raise UserError('additional_config "mars" must be a mapping, e.g. {"mars": {"theta": 0.9}}')
    if not speculative:
        raise UserError('MARS changes speculative decoding\'s verification, but none is configured: add '
                        '--speculative-config (e.g. \'{"method": "ngram", "num_speculative_tokens": 3, '
                        '"prompt_lookup_max": 3}\') or drop "mars" from --additional-config')
    if RESOLVED in config:
        return checked(config)
    unknown = sorted(set(config) - set(KEYS))
    if unknown:
        raise UserError(f'unknown key {unknown[0]!r} in additional_config "mars" (expected {", ".join(KEYS)})')
    force = config.get("force", False)
    if not isinstance(force, bool):
        raise UserError(f'"force" must be true or false, got {force!r}')
    measure = config.get("measure", "logit-ratio")
    if measure not in MARGIN_MEASURES:
        raise UserError(f'"measure" must be one of {", ".join(MARGIN_MEASURES)}, got {measure!r}')
    if "theta" in config:
        theta = config["theta"]
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) \
                or not 0 < theta <= 1:
            raise UserError(f'"theta" must be a number in (0, 1] (1: nothing relaxed, as strict), got {theta!r}')
        return _resolved(measure, float(theta), float(theta), "theta")
    wanted = config.get("profile", "auto")
    if not isinstance(wanted, str) or not wanted:
        raise UserError('"profile" must be a profile file\'s path or "auto"')
    if wanted == "auto":
        profile = profiles.find_for(_fingerprint(model))
        if profile is None:
            return _resolved(measure, DEFAULT_THRESHOLD, DEFAULT_THRESHOLD, "default")
    else:
        profile = profiles.load(wanted)
        fingerprint = _fingerprint(model)
        if profile.fingerprint != fingerprint and not force:
            raise UserError(f"profile {wanted} was calibrated for {profile.data['model']['name']!r}, not for the "
                            f"target {model} (fingerprint {profile.fingerprint[:12]}, the target's "
                            f'{fingerprint[:12]}); calibrate it with `mars calibrate` or add "force": true')
    return _resolved(measure, profiles.raw_threshold(profile, measure, 0.0),
                     profiles.raw_threshold(profile, measure, 1.0), str(profile.path))


def mapping_for(verification: "VerifyOptions") -> dict[str, Any] | None:
    """The "mars" mapping `mars` flags stand for (--verify, --threshold, --calibration, --margin,
    --force), as a user would write it; None for --verify strict (vLLM's own rule)."""
    if verification.verify == "strict":
        return None
    mapping: dict[str, Any] = {"measure": verification.margin}
    if verification.threshold is not None:
        mapping["theta"] = verification.threshold  # wins over a profile, as in `mars generate`
    elif verification.calibration is not None:
        mapping["profile"] = verification.calibration
    if verification.force:
        mapping["force"] = True
    return mapping


def checked(resolved: object) -> dict[str, Any]:
    """A mapping that claims to be resolved, checked as if a user wrote it (one did, maybe): exactly
    the resolved keys, the marker true, a known measure, both thresholds numbers in (0, 1]."""
    if not isinstance(resolved, Mapping) or set(resolved) != set(RESOLVED_KEYS) or resolved[RESOLVED] is not True:
        given = sorted(resolved) if isinstance(resolved, Mapping) else type(resolved).__name__
        raise UserError(f'additional_config "mars" with "{RESOLVED}" must hold exactly {", ".join(RESOLVED_KEYS)} '
                        f'({RESOLVED} true), got {given}; write {{"theta": ...}} or {{"profile": ...}} instead')
    if resolved["measure"] not in MARGIN_MEASURES:
        raise UserError(f'"measure" must be one of {", ".join(MARGIN_MEASURES)}, got {resolved["measure"]!r}')
    for mode in ("greedy", "sampled"):
        value = resolved[mode]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 < value <= 1:
            raise UserError(f'"{mode}" must be a threshold in (0, 1], got {value!r}')
    if not isinstance(resolved["source"], str) or not resolved["source"]:
        raise UserError(f'"source" must name where the thresholds came from, got {resolved["source"]!r}')
    return {RESOLVED: True, "measure": resolved["measure"], "greedy": float(resolved["greedy"]),
            "sampled": float(resolved["sampled"]), "source": resolved["source"]}


def thresholds(resolved: Mapping[str, Any]) -> Thresholds:
    """The sampler's setting from a resolved mapping, checked again (it came through user input)."""
    valid = checked(resolved)
    return Thresholds(valid["measure"], valid["greedy"], valid["sampled"])


def describe(resolved: Mapping[str, Any]) -> str:
    """One line for logs and `mars serve`: what MARS decodes with, and where it came from."""
    where = {"theta": "given", "default": "the paper's default: no profile matches this target"}
    source = where.get(resolved["source"], f"profile {resolved['source']}")
    return (f"MARS on: {resolved['measure']} theta {resolved['greedy']:g} (greedy), {resolved['sampled']:g} "
            f"(sampled, at T = 1), {source}")


def _resolved(measure: str, greedy: float, sampled: float, source: str) -> dict[str, Any]:
    return {RESOLVED: True, "measure": measure, "greedy": greedy, "sampled": sampled, "source": source}


def _fingerprint(model: str | Path) -> str:
    """The target's fingerprint from its files (a hub id is looked up in the local hub cache)."""
    from ..models import file_fingerprint

    path = Path(model).expanduser()
    if not path.is_dir():
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(str(model), local_files_only=True))
        except Exception:  # noqa: BLE001 - any failure means: not on this machine
            raise UserError(f"cannot find the target {model} on this machine to match a profile by fingerprint; "
                            'give "profile" a path or "theta" a value') from None
    return file_fingerprint(path)
