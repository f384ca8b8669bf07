"""Rich renderings shared by the subcommands (tables, bars)."""

from __future__ import annotations

from rich.table import Table as RichTable
from rich.text import Text

from .terminal import shown


class Table(RichTable):
    """A rich table whose string cells and title are plain text: a model name or a file path
    holding `[...]` or escape sequences is shown as it is, never read as markup or obeyed."""

    def __init__(self, *args, title: str | Text | None = None, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, title=Text(shown(title)) if isinstance(title, str) else title, **kwargs)

    def add_row(self, *cells, **kwargs) -> None:  # type: ignore[no-untyped-def,override]
        super().add_row(*(Text(shown(cell)) if isinstance(cell, str) else cell for cell in cells), **kwargs)


def stats_table(stats: dict, config: dict, server: dict | None = None) -> Table:
    """The `--stats` table of `mars generate`; `server`: the warm server that decoded it, if one did."""
    table = Table(title="decoding stats", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    rule = config["verify"]
    if rule == "mars":
        rule += f" ({config['margin']} > {config['threshold']:.3f}, from {config['threshold_source']})"
    table.add_row("target / draft", f"{config['target']} / {config['draft']}")
    if config.get("kernels"):
        table.add_row("precision", f"{config['dtype']} on this project's kernels ({config['kernels']})")
    table.add_row("verification", rule)
    table.add_row("new tokens", str(stats["new_tokens"]))
    table.add_row("tokens/s", f"{stats['tokens_per_s']:.2f}")
    table.add_row("wall", f"{stats['wall_s']:.2f} s")
    table.add_row("rounds", str(stats["rounds"]))
    table.add_row("mean accepted (tau)", f"{stats['mean_accepted']:.2f}")
    if stats["drafted"]:
        table.add_row("accepted / drafted", f"{stats['accepted']} / {stats['drafted']} ({stats['acceptance_rate']:.1%})")
        per_position = " ".join(f"{rate:.2f}" for rate in stats["per_position_acceptance"])
        table.add_row("acceptance by depth", per_position)
    if stats.get("tree"):
        table.add_row("draft tree", _tree_line(stats["tree"], config))
    if rule.startswith("mars"):
        table.add_row("relaxed accepts", str(stats["relaxed"]))
        table.add_row("low-margin share", f"{stats['low_margin_share']:.1%}")
    split = stats["time_s"]
    total = sum(split.values()) or 1.0
    table.add_row("time split", ", ".join(f"{k} {v / total:.0%}" for k, v in split.items() if v > 0))
    table.add_row("finish", stats["finish_reason"])
    if stats.get("startup_s"):
        table.add_row("start-up", ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in stats["startup_s"].items()
                                            if seconds is not None))
    choice = config.get("engine_choice")
    if choice:
        table.add_row("engine", f"{choice['engine']} (--engine auto: {choice['why']}"
                      + ("; cached" if choice["cached"] else "") + ")")
    if server:
        table.add_row("decoded by", f"the warm server (pid {server['pid']}; session {server['session']})")
    return table


def _tree_line(tree: dict, config: dict) -> str:
    return (f"top-{config['tree_topk']}, up to {config['tree_tokens']} nodes: {tree['mean_nodes']:.1f} nodes and "
            f"depth up to {tree['max_depth']} over {tree['rounds']} rounds")


def calibration_table(profile: dict) -> list[Table | str]:
    """What `mars calibrate` found: per mode and margin measure for rate= / loss=; for quality=,
    each mode's sweep (one row per theta with its decision, the chosen one marked), the loss bound
    beside it and a line per deciding theta saying how many samples a clear decision needs."""
    objective = profile["objective"]
    modes = profile.get("modes") or {"sampled": profile}
    if objective["kind"] == "quality":
        shown: list[Table | str] = []
        for mode, block in modes.items():
            shown.append(_sweep_table(profile, mode, block))
            shown.extend(_power_lines(block["sweep"]))
        return shown
    table = Table(title=f"calibration of {profile['model']['name']} "
                        f"(objective {objective['kind']}={objective['value']:g})", title_justify="left")
    for column in ("mode", "measure", "theta", "90% interval", "positions", "held-out rate", "held-out loss",
                   "theta=0.9 rate", "median margin"):
        table.add_column(column, justify="left" if column in ("mode", "measure") else "right", no_wrap=True)
    for mode, block in modes.items():
        label = f"{mode} (T={block['temperature']:g})"
        for measure, theta in block["thresholds"].items():
            low, high = block["threshold_interval_90"][measure]
            held = block["held_out"][measure]
            paper = block["at_paper_theta_0.9"][measure]
            median = block["quantiles"][measure].get("0.5", float("nan"))
            table.add_row(label, measure, f"{theta:.4f}", f"{low:.4f}-{high:.4f}",
                          str(block.get("positions", profile["samples"])), f"{held['rate']:.1%}",
                          f"{held['loss']:.4f}", f"{paper['rate']:.1%}", f"{median:.4f}")
    return [table]


def _sweep_table(profile: dict, mode: str, block: dict) -> Table:
    sweep, bound = block["sweep"], block["loss_bound"]
    measure = sweep["measure"]
    chosen = sweep["chosen"]
    picked = f"theta {chosen:g}" if chosen is not None else "none clearly held quality: theta 1 (strict)"
    if sweep.get("decision") == "unclear":
        hopeful = sweep.get("chosen_if_unclear_passed")
        picked += (f", unclear: with every unclear theta passing it would be "
                   f"{'theta 1 (strict)' if hopeful is None else f'theta {hopeful:g}'}")
    grown = sweep.get("growth")
    counted = f"{sweep['samples']} samples" + (
        f" ({' -> '.join(str(step['samples_per_suite']) for step in grown)} a suite, --limit auto)" if grown else "")
    table = Table(title=f"{mode} (T={block['temperature']:g}) sweep of {profile['model']['name']}, {measure}, "
                        f"drafter {block['drafter']}, {counted}: {picked}; loss bound "
                        f"{bound['objective']['value']:g} would give {bound['thresholds'][measure]:.4f} (at the "
                        f"chosen theta the bound is {bound['at_chosen']['loss']:.3f} nats/token)", title_justify="left")
    metrics = [name for name in sweep["strict"] if name not in ("tau", "relaxed_share")]
    for column in ("theta", "tau", "relaxed", *metrics, "decision"):
        table.add_column(column, justify="right", no_wrap=True)
    strict = sweep["strict"]
    table.add_row("strict", f"{strict['tau']:.2f}", "-", *(f"{strict[name]:.3f}" for name in metrics), "-")
    for row in sorted(sweep["rows"], key=lambda r: r["theta"], reverse=True):
        cells = []
        for name in metrics:
            figure = row["metrics"].get(name)
            cells.append("-" if figure is None else f"{figure['value']:.3f} ({-figure['drop']:+.1%})")
        mark = " *" if row["theta"] == chosen else ""
        table.add_row(f"{row['theta']:g}{mark}", f"{row['tau']:.2f}", f"{row['relaxed_share']:.1%}", *cells,
                      row.get("decision", "-"))
    return table


def _power_lines(sweep: dict) -> list[str]:
    """One line per deciding theta: the samples a suite that make its decision clear at 95%."""
    lines = []
    for entry in sweep.get("samples_needed", []):
        theta, samples = entry["theta"], entry["samples"]
        if samples is None:
            lines.append(f"no sample size makes the decision at theta {theta:g} clear: a drop on the line, or "
                         f"too few samples to measure its spread (this run: {sweep['samples_per_suite']} a suite)")
        else:
            lines.append(f"a clear decision at theta {theta:g} ({entry['outcome']}) needs about {samples} samples "
                         f"a suite (this run: {sweep['samples_per_suite']})")
    return lines


def _bar(share: float, width: int = 30) -> str:
    filled = max(0, min(width, round(share * width)))
    return "█" * filled + "·" * (width - filled)


def profile_tables(report: dict) -> list[Table | str]:
    """The `mars profile` report: time split, acceptance, margins, sweeps."""
    stats, config = report["stats"], report["config"]
    tables: list[Table | str] = []
    head = Table(title="decoding profile", show_header=False, title_justify="left")
    head.add_column("what", style="bold")
    head.add_column("value")
    rule = config["verify"] + (f" ({config['margin']} > {config['threshold']:.3f}, from {config['threshold_source']})"
                               if config["verify"] == "mars" else "")
    head.add_row("target / draft", f"{config['target']} / {config['draft']}  (k = {config['num_draft']})")
    head.add_row("verification", rule)
    head.add_row("tokens/s", f"{stats['tokens_per_s']:.2f}  ({stats['new_tokens']} tokens in {stats['wall_s']:.2f} s)")
    head.add_row("tau / acceptance", f"{stats['mean_accepted']:.2f} / {stats['acceptance_rate']:.1%}"
                 + (f"  relaxed {stats['relaxed']}" if config["verify"] == "mars" else ""))
    if stats.get("tree"):
        head.add_row("draft tree", _tree_line(stats["tree"], config))
    memory = report["memory"]
    head.add_row("peak memory", "  ".join(f"{k.removeprefix('peak_').removesuffix('_mb')} {v:.0f} MB" for k, v in memory.items()))
    if "instrumentation" in report:
        cost = report["instrumentation"]
        head.add_row("timing overhead", f"{cost['estimated_share']:.3%} of wall ({cost['per_lap_s'] * 1e6:.2f} µs a lap); "
                     f"on vs off: {cost['measured_share']:+.1%} (median of {cost['repeats']}, machine noise included)")
    tables.append(head)

    split = Table(title="where the time goes", title_justify="left")
    for column in ("phase", "seconds", "share", ""):
        split.add_column(column, justify="right" if column in ("seconds", "share") else "left")
    for phase, entry in report["time_split"].items():
        split.add_row(phase, f"{entry['seconds']:.3f}", f"{entry['share']:.1%}", _bar(entry["share"]))
    rest = report["outside_forwards"]  # a subtotal of the rows above, not one more part
    split.add_row(Text("of which not a forward", style="dim"),
                  f"{rest['seconds']:.3f}", f"{rest['share']:.1%}", _bar(rest["share"]))
    tables.append(split)

    histogram = report["accepted_length_histogram"]
    if stats["drafted"]:
        accept = Table(title="accepted drafts per round, and acceptance per draft position (a tree's depth)",
                       title_justify="left")
        accept.add_column("n")
        accept.add_column("rounds", justify="right")
        accept.add_column("")
        accept.add_column("acceptance at position n", justify="right")
        rounds = max(1, sum(histogram.values()))
        positions = report["per_position_acceptance"]
        for n in range(max(len(positions) + 1, len(histogram))):
            count = histogram.get(str(n), 0)
            rate = f"{positions[n - 1]:.1%}" if 1 <= n <= len(positions) else ""
            accept.add_row(str(n), str(count), _bar(count / rounds, 20), rate)
        tables.append(accept)

    margins = report["margins"]
    relax = Table(title=f"margins ({margins['measure']}) of {len(margins['values'])} generated positions: "
                        "share that each threshold makes low-margin", title_justify="left")
    relax.add_column("theta", justify="right")
    relax.add_column("share", justify="right")
    relax.add_column("")
    for theta, share in margins["share_above"].items():
        marker = "  ← active" if abs(float(theta) - margins["threshold"]) < 1e-12 else ""
        relax.add_row(f"{float(theta):.3f}", f"{share:.1%}", _bar(share, 20) + marker)
    tables.append(relax)

    if report.get("num_draft_sweep"):
        sweep = Table(title="draft length sweep", title_justify="left")
        for column in ("k", "tokens/s", "tau", "acceptance", ""):
            sweep.add_column(column, justify="right")
        for row in report["num_draft_sweep"]:
            sweep.add_row(str(row["num_draft"]), f"{row['tokens_per_s']:.2f}", f"{row['mean_accepted']:.2f}",
                          f"{row['acceptance_rate']:.1%}", "best" if row["best"] else "")
        tables.append(sweep)
    if report.get("widths"):
        widths = report["widths"]
        curve = Table(title=f"target forward cost by width ({widths['key']['device']}, {widths['key']['dtype']}"
                            f"{', compiled' if widths['key']['compiled'] else ''}; cached for --num-draft auto)",
                      title_justify="left")
        for column in ("width", "ms", "vs width 1", ""):
            curve.add_column(column, justify="right")
        top = max(widths["relative_to_width_1"].values())
        for width, ms in widths["ms_by_width"].items():
            relative = widths["relative_to_width_1"][width]
            curve.add_row(width, f"{ms:.1f}", f"{relative:.2f}x", _bar(relative / top, 20))
        tables.append(curve)
        if widths["best_num_draft"] is not None:
            rates = " ".join(f"{rate:.2f}" for rate in widths["acceptance_by_position"])
            tables.append(f"--num-draft auto picks k = {widths['best_num_draft']} for this run's acceptance by "
                          f"position ({rates}) and {widths['draft_ms_per_token']:.1f} ms per drafted token")
    if report.get("dtypes"):
        tables.extend(dtype_table(report["dtypes"]))
    if report.get("by_position"):
        growth = Table(title="tokens/s by output position (KV cache growth)", title_justify="left")
        growth.add_column("positions")
        growth.add_column("tokens/s", justify="right")
        for row in report["by_position"]:
            growth.add_row(f"{row['from']}-{row['to']}", f"{row['tokens_per_s']:.2f}")
        tables.append(growth)
    return tables


def dtype_table(measured: dict) -> list[Table | str]:
    """`mars profile --dtypes`: a plain decoding step in each dtype, each one's check, the choice;
    for a drafting session also the estimated milliseconds per token it was chosen by."""
    key = measured["key"]
    speculative = key.get("decoding") == "speculative"
    table = Table(title=f"plain decoding step by dtype ({key['device']}, {key['threads']} threads, torch "
                        f"{key['torch']}; {measured['steps']} steps a block, median of the blocks)", title_justify="left")
    columns = ("dtype", "ms per step", *(("ms per token, drafting (est.)", "best shape", "forward cost by width "
                                          "(x width 1)") if speculative else ()), "usable", "chosen")
    for column in columns:
        table.add_column(column, justify="right" if column.startswith("ms per") else "left")
    for candidate in measured["candidates"]:
        ms = candidate["ms_per_step"]
        agreement = candidate["agreement"]
        if candidate["usable"]:
            usable = "yes (the reference)" if candidate["dtype"] == "float32" else f"yes (argmax agrees {agreement:.0%})"
        else:
            usable = f"no: {candidate['problem']}"
        per_token, shape, relative = candidate.get("ms_per_token"), candidate.get("shape"), candidate.get("curve")
        widths = ", ".join(f"{w}: {r:.2f}" for w, r in (relative or {}).items() if w != "1") or "-"
        estimate = ("-" if per_token is None else f"{per_token:.1f}", shape or "-", widths) if speculative else ()
        label = candidate["dtype"] + (" (packed linears)" if candidate.get("packed") else "")
        table.add_row(label, "-" if ms is None else f"{ms:.1f}", *estimate, usable,
                      "← --dtype auto" if candidate["dtype"] == measured["chosen"] else "")
    lines: list[Table | str] = [table]
    if measured.get("exact_kept_over"):
        lines.append(f"float32 kept, exact: {measured['exact_kept_over']} was faster, but not by "
                     f"{1 - measured['exact_preference']:.0%}")
    if measured["provisional"]:
        lines.append(f"cached as provisional ({measured['provisional']}) in {measured['path']}: --dtype auto "
                     "measures again once the machine is quiet")
    else:
        lines.append(f"cached for --dtype auto in {measured['path']}")
    return lines


def tune_table(rows: list[dict], machine: dict) -> Table:
    """`mars tune`: each measured choice, what it chose, what decided it and how long it took."""
    table = Table(title=f"tuned for {machine['cpu']} ({' '.join(machine['flags'])}; {machine['threads']} threads, "
                        f"torch {machine['torch']})", title_justify="left")
    for column in ("choice", "chosen", "measured", "seconds", "entry"):
        table.add_column(column, justify="right" if column == "seconds" else "left")
    for row in rows:
        chosen = row["chosen"] + (f" (provisional: {row['provisional']})" if row.get("provisional") else "")
        table.add_row(row["what"], chosen, row["detail"], f"{row['seconds']:.1f}", row.get("entry") or "-")
    return table


def eval_table(scope: str, rows: list[dict]) -> Table:
    """One `mars eval` table: speed and quality per method (the wall speedup with its interval;
    report.md has the others')."""
    from .evaluation.report import COLUMNS, cell

    table = Table(title=f"suite: {scope}", title_justify="left")
    for header, _, _ in COLUMNS:
        table.add_column(header, justify="left" if header == "method" else "right", no_wrap=header == "method")
    for row in rows:
        table.add_row(*(cell(row, key, spec, intervals=("speedup",)) for _, key, spec in COLUMNS))
    return table


def head_table(head, held, prompts: int, answer_tokens: int) -> Table:
    """What training produced: the head's size and its held-out acceptance."""
    table = Table(title="draft head", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="left")
    parameters = sum(p.numel() for p in head.parameters())
    table.add_row("trained for", head.target_name)
    table.add_row("parameters", f"{parameters / 1e6:.2f} M trained (fp16 {2 * parameters / 2**20:.1f} MiB)")
    table.add_row("draft vocabulary", f"{head.vocab_ids.numel()} tokens, {held.coverage:.1%} of held-out answer tokens")
    table.add_row("data", f"{prompts} prompts, {answer_tokens} answer tokens")
    table.add_row("held-out rounds", str(held.rounds))
    table.add_row("acceptance by position", " ".join(f"{rate:.2f}" for rate in held.per_position))
    table.add_row("expected tau (strict greedy)", f"{held.tau:.2f} from every position, "
                  f"{held.decoding_tau:.2f} in decoding's rounds")
    table.add_row("KL(target || head), first draft", f"{held.divergence:.3f} nats")
    return table
