"""Rich renderings shared by the subcommands (tables, bars)."""

from __future__ import annotations

from rich.table import Table


def stats_table(stats: dict, config: dict) -> Table:
    """The `--stats` table of `mars generate`."""
    table = Table(title="decoding stats", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    rule = config["verify"]
    if rule == "mars":
        rule += f" ({config['margin']} > {config['threshold']:.3f}, from {config['threshold_source']})"
    table.add_row("target / draft", f"{config['target']} / {config['draft']}")
    table.add_row("verification", rule)
    table.add_row("new tokens", str(stats["new_tokens"]))
    table.add_row("tokens/s", f"{stats['tokens_per_s']:.2f}")
    table.add_row("wall", f"{stats['wall_s']:.2f} s")
    table.add_row("rounds", str(stats["rounds"]))
    table.add_row("mean accepted (tau)", f"{stats['mean_accepted']:.2f}")
    if stats["drafted"]:
        table.add_row("accepted / drafted", f"{stats['accepted']} / {stats['drafted']} ({stats['acceptance_rate']:.1%})")
        per_position = " ".join(f"{rate:.2f}" for rate in stats["per_position_acceptance"])
        table.add_row("acceptance by position", per_position)
    if rule.startswith("mars"):
        table.add_row("relaxed accepts", str(stats["relaxed"]))
        table.add_row("low-margin share", f"{stats['low_margin_share']:.1%}")
    split = stats["time_s"]
    total = sum(split.values()) or 1.0
    table.add_row("time split", "  ".join(f"{k} {v / total:.0%}" for k, v in split.items() if v > 0))
    table.add_row("finish", stats["finish_reason"])
    return table


def calibration_table(profile: dict) -> Table:
    """What `mars calibrate` found, per margin measure."""
    objective = profile["objective"]
    table = Table(title=f"calibration of {profile['model']['name']} "
                        f"({profile['samples']} positions, T={profile['temperature']}, "
                        f"objective {objective['kind']}={objective['value']:g})", title_justify="left")
    for column in ("measure", "theta", "90% interval", "held-out rate", "held-out loss", "theta=0.9 rate",
                   "median margin"):
        table.add_column(column, justify="right" if column != "measure" else "left", no_wrap=column == "measure")
    for measure, theta in profile["thresholds"].items():
        low, high = profile["threshold_interval_90"][measure]
        held = profile["held_out"][measure]
        paper = profile["at_paper_theta_0.9"][measure]
        table.add_row(measure, f"{theta:.4f}", f"{low:.4f}-{high:.4f}", f"{held['rate']:.1%}",
                      f"{held['loss']:.4f}", f"{paper['rate']:.1%}", f"{profile['quantiles'][measure].get('0.5', float('nan')):.4f}")
    return table
