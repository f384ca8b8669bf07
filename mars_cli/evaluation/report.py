"""Eval artefacts: results.json, report.md and PNG plots, each written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..paths import write_atomic

COLUMNS = [
    ("method", "method", "{}"),
    ("samples", "samples", "{}"),
    ("tok/s", "tokens_per_s", "{:.2f}"),
    ("speedup", "speedup", "{:.3f}x"),
    ("tau", "tau", "{:.2f}"),
    ("fwd/tok", "forwards_per_token", "{:.3f}"),
    ("modelled", "modelled_speedup", "{:.3f}x"),
    ("accept", "acceptance_rate", "{:.1%}"),
    ("relaxed", "relaxed_share", "{:.1%}"),
    ("task", "task_metric", "{:.3f}"),
    ("agree tok", "agreement_tokens", "{:.3f}"),
    ("agree ROUGE-L", "agreement_rouge_l", "{:.3f}"),
    ("logprob", "mean_logprob", "{:.3f}"),
    ("peak RSS MB", "peak_rss_mb", "{:.0f}"),
]


def cell(row: dict, key: str, spec: str, intervals: tuple[str, ...] | None = None) -> str:
    """A row's figure, with its 95% interval where it has one (only the keys in `intervals`, when given)."""
    value = row.get(key)
    if value is None:
        return "-"
    text = spec.format(value)
    span = row.get("intervals", {}).get(key) if intervals is None or key in intervals else None
    return f"{text} [{spec.format(span[0])}, {spec.format(span[1])}]" if span else text


def comparison_lines(results: dict) -> list[str]:
    """The --baseline section: each figure's change with its 95% interval, per scope and method."""
    found = results.get("baseline")
    if not found:
        return []
    lines = [f"## Against the baseline", "", f"`{found['path']}`; changes with 95% paired bootstrap intervals "
             "(relative figures in %).", "", "| scope | method | figure | baseline | this run | change | 95% interval |",
             "|---|---|---|---|---|---|---|"]
    for entry in found["comparisons"]:
        scale, unit = (100.0, "%") if entry["relative"] else (1.0, "")
        lines.append(f"| {entry['scope']} | {entry['method']} | {entry['label']} | {entry['baseline']:.4g} | "
                     f"{entry['current']:.4g} | {entry['change'] * scale:+.2f}{unit} | "
                     f"[{entry['low'] * scale:+.2f}, {entry['high'] * scale:+.2f}]{unit} |")
    return lines + [""]


def markdown(results: dict) -> str:
    lines = [f"# mars eval: {', '.join(results['suites'])}", "",
             f"`{results['command']}`", "",
             f"target `{results['config']['target']}`, draft `{results['config']['draft']}` (vanilla: none), "
             f"k = {results['config']['num_draft']}, max {results['config']['max_new_tokens']} new tokens, "
             f"temperature {results['config']['temperature']}, {results['config']['threads']} threads, "
             f"torch {results['config']['torch_version']}, repeats {results['repeats']}"
             + (f", {results['config']['engine']} batches of {results['config']['batch_size']}"
                if "batch_size" in results["config"] else f", engine {results['config'].get('engine', 'transformers')}")
             + ".", "",
             *[f"- `{name}`: threshold {spec['threshold']:g} ({spec['threshold_source']})"
               for name, spec in results["methods"].items() if "threshold" in spec and "threshold_source" in spec],
             "",
             "Speedup is tokens/s against `vanilla` (plain decoding) measured in the same run, interleaved per "
             "sample. fwd/tok is target forwards per emitted token; modelled is plain decoding's cost per token "
             "over the method's, both priced by one cost curve of the target forward by width "
             f"({(results.get('cost_curve') or {}).get('source', 'none')}), drafting not priced. Brackets: 95% "
             "bootstrap intervals over samples. Agreement compares each output with vanilla's for the same sample "
             "(token level and ROUGE-L over tokens); logprob is the target's mean log-probability of the generated "
             "tokens; task is the suite's own metric.", "",
             _determinism_line(results), ""]
    for scope, rows in results["table"].items():
        lines += [f"## {scope}", "", "| " + " | ".join(c[0] for c in COLUMNS) + " |",
                  "|" + "---|" * len(COLUMNS)]
        for row in rows:
            lines.append("| " + " | ".join(cell(row, key, spec) for _, key, spec in COLUMNS) + " |")
        lines.append("")
    lines += comparison_lines(results)
    if results.get("gates"):
        gates = results["gates"]
        lines += ["## Gates", "", "passed" if not gates["failures"] else "FAILED:", ""]
        lines += [f"- {'ok' if o['passed'] else 'FAILED'}: {o['message']}" for o in gates.get("outcomes", [])]
        lines.append("")
    if results.get("plots"):
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in results["plots"]] + [""]
    if not results.get("complete", True):
        lines += ["*Interrupted: the table covers the samples finished so far; rerun with --resume.*", ""]
    return "\n".join(lines)


def _determinism_line(results: dict) -> str:
    found = results.get("determinism") or {}
    if found.get("deterministic"):
        return ("Deterministic: tau, fwd/tok, modelled, task, agreement and logprob repeat exactly for this code "
                "on this machine (greedy, float32, fixed draft shape).")
    return "Not deterministic: " + "; ".join(found.get("because", ["not recorded"])) + "."


def plots(results: dict, folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["table"]["all" if "all" in results["table"] else results["suites"][0]]
    written = []

    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    for row in rows:
        if row["speedup"] is None or row["agreement_rouge_l"] is None:
            continue
        drawn = axis.errorbar(row["speedup"], row["agreement_rouge_l"], xerr=_error(row, "speedup"), fmt="o",
                              capsize=3)
        if row.get("modelled_speedup") is not None:
            axis.errorbar(row["modelled_speedup"], row["agreement_rouge_l"], xerr=_error(row, "modelled_speedup"),
                          fmt="s", mfc="none", capsize=3, color=drawn[0].get_color())
        axis.annotate(row["method"], (row["speedup"], row["agreement_rouge_l"]), textcoords="offset points",
                      xytext=(4, 4), fontsize=8)
    axis.set_xlabel("speedup vs vanilla: wall (filled), modelled (hollow); bars: 95% intervals")
    axis.set_ylabel("agreement with vanilla (ROUGE-L)")
    axis.set_title("speed vs quality")
    axis.grid(alpha=0.3)
    written.append(_save(figure, folder / "speed_quality.png"))

    sweep = [row for row in rows if row["method"].startswith("mars@")]
    if sweep:
        thetas = [float(row["method"].split("@")[1]) for row in sweep]
        figure, (speed, accepted) = plt.subplots(2, 1, figsize=(6.5, 6.5), sharex=True)
        for key, label, colour in (("speedup", "wall speedup", "tab:blue"),
                                   ("modelled_speedup", "modelled speedup", "tab:green")):
            if all(row.get(key) is not None for row in sweep):
                speed.errorbar(thetas, [row[key] for row in sweep], yerr=_errors(sweep, key), marker="o",
                               capsize=3, label=label, color=colour)
        speed.set_ylabel("speedup vs vanilla")
        speed.legend(fontsize=8)
        speed.grid(alpha=0.3)
        speed.set_title("MARS threshold sweep (bars: 95% intervals over samples)")
        accepted.errorbar(thetas, [row["tau"] for row in sweep], yerr=_errors(sweep, "tau"), marker="o", capsize=3,
                          color="tab:purple", label="tau")
        accepted.set_ylabel("tau (tokens per round)", color="tab:purple")
        accepted.set_xlabel("theta")
        other = accepted.twinx()
        other.plot(thetas, [row["agreement_rouge_l"] for row in sweep], marker="s", color="tab:red")
        other.set_ylabel("agreement with vanilla (ROUGE-L)", color="tab:red")
        written.append(_save(figure, folder / "sweep.png"))

    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    for row in rows:
        rates = row["per_position_acceptance"]
        if rates:
            axis.plot(range(1, len(rates) + 1), rates, marker="o", label=row["method"])
    axis.set_xlabel("draft position (a tree's depth)")
    axis.set_ylabel("acceptance rate")
    axis.set_ylim(0, 1)
    axis.set_title("acceptance per draft position")
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=8)
    written.append(_save(figure, folder / "acceptance.png"))
    return written


def _error(row: dict, key: str) -> list[list[float]] | None:
    """matplotlib's asymmetric error bar for a row's figure, from its interval (None without one)."""
    span = row.get("intervals", {}).get(key)
    if not span or row.get(key) is None:
        return None
    return [[max(0.0, row[key] - span[0])], [max(0.0, span[1] - row[key])]]


def _errors(rows: list[dict], key: str) -> list[list[float]] | None:
    bars = [_error(row, key) for row in rows]
    if any(bar is None for bar in bars):
        return None
    return [[bar[0][0] for bar in bars], [bar[1][0] for bar in bars]]


def _save(figure, path: Path) -> str:
    import matplotlib.pyplot as plt

    temporary = path.with_name(path.stem + ".tmp.png")
    figure.tight_layout()
    figure.savefig(temporary, dpi=110)
    plt.close(figure)
    os.replace(temporary, path)
    return str(path)


def write_all(results: dict, folder: Path, with_plots: bool) -> None:
    if with_plots:
        results["plots"] = plots(results, folder)
    write_atomic(folder / "results.json", json.dumps(results, indent=1, ensure_ascii=False))
    write_atomic(folder / "report.md", markdown(results))
