"""`mars calibrate --plot`: the quality sweep a profile stores, drawn so the choice can be checked
by eye: per mode, tau against theta (strict's as a line) above quality relative to strict (each
metric with its interval: 95% paired, or 90% in profiles made before paired intervals, the 1 - DROP
line), the chosen theta marked in both."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import UserError
from . import profiles


def replot(source: Path, path: Path) -> Path:
    """`mars calibrate --replot SOURCE --plot PATH`: the sweep stored in a profile file, drawn again."""
    return plot_sweeps(profiles.load(source).data, path, str(source))


def drop_interval(figure: dict) -> Any:
    """A metric's drop interval: `drop_interval_95` (paired), else an older profile's `drop_interval_90`."""
    return figure.get("drop_interval_95", figure.get("drop_interval_90"))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_drawable(profile: dict, swept: dict[str, dict], origin: str) -> None:
    """What drawing reads beyond what profile validation checks (a hand-edited profile that loads
    may lack it): one sentence naming the first missing or malformed field, not a KeyError."""
    def require_field(condition: bool, field: str, expected: str) -> None:
        if not condition:
            raise UserError(f"cannot draw the sweep of profile {origin}: field '{field}' must be {expected}")

    require_field(_number((profile.get("objective") or {}).get("value")), "objective.value", "a number")
    for mode, block in swept.items():
        sweep, where = block["sweep"], f"modes.{mode}"
        require_field(isinstance(sweep, dict), f"{where}.sweep", "a mapping")
        objective = block.get("objective")
        require_field(isinstance(objective, dict) and _number(objective.get("value")), f"{where}.objective.value",
                      "a number")
        require_field(sweep.get("chosen") is None or _number(sweep.get("chosen")), f"{where}.sweep.chosen",
                      "a number or null")
        require_field(isinstance(sweep.get("measure"), str), f"{where}.sweep.measure", "a margin measure")
        strict = sweep.get("strict")
        require_field(isinstance(strict, dict) and _number(strict.get("tau")), f"{where}.sweep.strict.tau", "a number")
        for index, row in enumerate(sweep["rows"]):
            metrics = row.get("metrics", {})
            require_field(isinstance(metrics, dict), f"{where}.sweep.rows[{index}].metrics", "a mapping")
            for name, figure in metrics.items():
                interval = drop_interval(figure) if isinstance(figure, dict) else None
                require_field(isinstance(figure, dict) and _number(figure.get("drop")) and isinstance(interval, list)
                              and len(interval) == 2 and all(_number(v) for v in interval),
                              f"{where}.sweep.rows[{index}].metrics.{name}",
                              "a mapping with a numeric 'drop' and a two-number 'drop_interval_95' "
                              "(or 'drop_interval_90')")


def plot_sweeps(profile: dict, path: Path, origin: str = "being written") -> Path:
    """One column per mode with a stored sweep; a profile without one is a one-line error."""
    swept = {mode: block for mode, block in (profile.get("modes") or {}).items() if "sweep" in block}
    if not swept:
        raise UserError("this profile has no quality sweep to draw (calibrate with --objective quality=DROP)")
    check_drawable(profile, swept, origin)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, len(swept), figsize=(5.5 * len(swept), 7), squeeze=False, sharex="col")
    for column, (mode, block) in enumerate(swept.items()):
        _draw_mode(axes[0][column], axes[1][column], mode, block)
    figure.suptitle(f"{profile['model']['name']}: quality sweep (objective quality={profile['objective']['value']:g})")
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=110)
    except OSError as exc:
        raise UserError(f"cannot write plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)
    return path


def _draw_mode(speed, quality, mode: str, block: dict) -> None:
    sweep = block["sweep"]
    rows = sorted(sweep["rows"], key=lambda row: row["theta"])
    thetas = [row["theta"] for row in rows]
    chosen, drop = sweep.get("chosen"), block["objective"]["value"]
    speed.plot(thetas, [row["tau"] for row in rows], "o-", label="MARS")
    speed.axhline(sweep["strict"]["tau"], color="grey", linestyle="--", label="strict")
    speed.set_ylabel("tau (tokens per target pass)")
    speed.set_title(f"{mode} (T={block['temperature']:g}), drafter {block.get('drafter', '?')}")
    names = [name for name in sweep["strict"] if name not in ("tau", "relaxed_share")]
    for name in names:
        points = [(row["theta"], row["metrics"][name]) for row in rows if name in row.get("metrics", {})]
        if not points:  # rows without metrics (a hand-edited profile): nothing to draw for this one
            continue
        values = [1 - figure["drop"] for _, figure in points]
        low = [_bar(value - (1 - drop_interval(figure)[1])) for value, (_, figure) in zip(values, points)]
        high = [_bar((1 - drop_interval(figure)[0]) - value) for value, (_, figure) in zip(values, points)]
        quality.errorbar([theta for theta, _ in points], values, yerr=[low, high], marker="o", capsize=3,
                         label=name)
    quality.axhline(1 - drop, color="red", linestyle=":", label=f"1 - DROP ({1 - drop:g})")
    quality.axhline(1, color="grey", linestyle="--", linewidth=0.8)
    quality.set_ylabel("quality relative to strict")
    quality.set_xlabel(f"theta ({sweep['measure']})")
    if chosen is not None:
        for axis in (speed, quality):
            axis.axvline(chosen, color="green", alpha=0.6, label=f"chosen {chosen:g}" if axis is quality else None)
    speed.legend(fontsize=8)
    quality.legend(fontsize=8)


def _bar(length: float) -> float:
    """An error bar's length: never negative (a percentile interval may miss its point), and 0
    where a drop is infinite (a metric that strict scored 0)."""
    return max(0.0, length) if math.isfinite(length) else 0.0
