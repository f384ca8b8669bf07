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
    ("accept", "acceptance_rate", "{:.1%}"),
    ("relaxed", "relaxed_share", "{:.1%}"),
    ("task", "task_metric", "{:.3f}"),
    ("agree tok", "agreement_tokens", "{:.3f}"),
    ("agree ROUGE-L", "agreement_rouge_l", "{:.3f}"),
    ("logprob", "mean_logprob", "{:.3f}"),
    ("peak RSS MB", "peak_rss_mb", "{:.0f}"),
]


def cell(row: dict, key: str, spec: str) -> str:
    value = row.get(key)
    return "-" if value is None else spec.format(value)


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
             "sample. Agreement compares each output with vanilla's for the same sample (token level and ROUGE-L "
             "over tokens); logprob is the target's mean log-probability of the generated tokens; task is the "
             "suite's own metric.", ""]
    for scope, rows in results["table"].items():
        lines += [f"## {scope}", "", "| " + " | ".join(c[0] for c in COLUMNS) + " |",
                  "|" + "---|" * len(COLUMNS)]
        for row in rows:
            lines.append("| " + " | ".join(cell(row, key, spec) for _, key, spec in COLUMNS) + " |")
        lines.append("")
    if results.get("gates"):
        gates = results["gates"]
        lines += ["## Gates", "", "passed" if not gates["failures"] else "FAILED:", ""]
        lines += [f"- {failure}" for failure in gates["failures"]]
        lines.append("")
    if results.get("plots"):
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in results["plots"]] + [""]
    if not results.get("complete", True):
        lines += ["*Interrupted: the table covers the samples finished so far; rerun with --resume.*", ""]
    return "\n".join(lines)


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
        axis.scatter(row["speedup"], row["agreement_rouge_l"], s=40)
        axis.annotate(row["method"], (row["speedup"], row["agreement_rouge_l"]), textcoords="offset points",
                      xytext=(4, 4), fontsize=8)
    axis.set_xlabel("speedup vs vanilla (tokens/s ratio)")
    axis.set_ylabel("agreement with vanilla (ROUGE-L)")
    axis.set_title("speed vs quality")
    axis.grid(alpha=0.3)
    written.append(_save(figure, folder / "speed_quality.png"))

    sweep = [row for row in rows if row["method"].startswith("mars@")]
    if sweep:
        thetas = [float(row["method"].split("@")[1]) for row in sweep]
        figure, axis = plt.subplots(figsize=(6.5, 4.5))
        axis.plot(thetas, [row["speedup"] for row in sweep], marker="o", label="speedup", color="tab:blue")
        axis.set_xlabel("theta")
        axis.set_ylabel("speedup vs vanilla", color="tab:blue")
        other = axis.twinx()
        other.plot(thetas, [row["agreement_rouge_l"] for row in sweep], marker="s", color="tab:red", label="agreement")
        other.set_ylabel("agreement with vanilla (ROUGE-L)", color="tab:red")
        axis.set_title("MARS threshold sweep: speed against quality")
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
