"""`mars profile`: where decoding time goes, and how cost grows with the draft length and the
output length. Everything here drives the ordinary decoding loop through a Session."""

from __future__ import annotations

import dataclasses
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from .decoding import cost
from .decoding.controller import AdaptiveDraftLength
from .decoding.stats import DecodeStats
from .calibration.collection import TopTwoRecorder
from .decoding.rules import margin
from .session import Session
from .tuning.curve import curve_for

DEFAULT_PROMPT = (
    "Summarize in two sentences: The library will extend its opening hours during the exam period. "
    "From Monday to Friday it will open at seven in the morning and close at midnight, and the "
    "study rooms can be booked online for up to three hours a day."
)
FORWARD_PHASES = ("prefill", "draft", "target")  # the phases that run a model
OTHER_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    """Peak resident memory of this process (and peak CUDA memory on a GPU)."""
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = {"peak_rss_mb": rss_kb / 1024 if sys.platform != "darwin" else rss_kb / 2**20}
    if device.type == "cuda":
        peak["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return peak


def parse_range(text: str) -> list[int]:
    """'1:8' -> [1..8]; '2,4,8' -> [2, 4, 8]."""
    from .errors import UserError

    bounds = f"--sweep-num-draft {text!r}: draft lengths must lie in 1..64"
    try:
        if ":" in text:
            low, high = (int(part) for part in text.split(":"))
            if not 1 <= low <= high <= 64:  # bounded before the range is made (1:10000000000 ran out of memory)
                raise UserError(bounds)
            values = list(range(low, high + 1))
        else:
            values = [int(part) for part in text.split(",")]
    except ValueError:
        raise UserError(f"--sweep-num-draft {text!r}: expected LOW:HIGH or a comma-separated list") from None
    if not values or min(values) < 1 or max(values) > 64:
        raise UserError(bounds)
    return values


def throughput_by_position(stats: DecodeStats, bucket: int) -> list[dict[str, float]]:
    """tokens/s within each block of `bucket` output positions (shows KV-cache growth)."""
    rows, start_time, start_tokens = [], stats.phase_s.get("prefill", 0.0), 0
    boundary = bucket
    for end_time, produced in stats.round_ends:
        if produced >= boundary:
            elapsed = end_time - start_time
            rows.append({"from": start_tokens, "to": produced,
                         "tokens_per_s": (produced - start_tokens) / elapsed if elapsed > 0 else 0.0})
            start_time, start_tokens = end_time, produced
            boundary = (produced // bucket + 1) * bucket
    return rows


def run_profile(session: Session, prompt: str, sweep: list[int] | None, bucket: int,
                overhead_repeats: int, trace: Path | None, widths: bool = False, dtypes: bool = False) -> dict:
    """The whole report as one dict (rendered by the CLI, dumped as --json). `dtypes`: the target
    was loaded with `measure_dtypes` (ModelOptions.load): its dtype measurement is reported."""
    prompt_ids = session.encode(prompt)
    # measured first, while nothing else has warmed the caches unevenly
    curve = curve_for(session.scorer, fresh=True) if widths else None
    warm = dataclasses.replace(session.settings(), max_new_tokens=min(8, session.options.max_new_tokens))
    session.run(prompt_ids, settings=warm)  # warm-up: first calls pay for allocation and dispatch

    recorder = TopTwoRecorder()
    main = session.run(prompt_ids, observe=recorder)
    margins = margin(*recorder.values(), session.options.verification.margin).tolist()  # type: ignore[arg-type]
    summary = main.stats.summary()
    report: dict = {
        "config": session.config(),
        "stats": summary,
        "memory": peak_memory_mb(session.target.output_device),
        "time_split": _time_split(summary),
        "outside_forwards": _outside_forwards(summary),
        "accepted_length_histogram": summary["accepted_length_histogram"],
        "per_position_acceptance": summary["per_position_acceptance"],
        "margins": {
            "measure": session.options.verification.margin,
            "threshold": session.threshold.value,
            "values": margins,
            "share_above": {str(t): _share_above(margins, t) for t in sorted({*OTHER_THRESHOLDS, session.threshold.value})},
        },
        "by_position": throughput_by_position(main.stats, bucket),
    }
    if dtypes and session.target.dtype_choice is not None:
        report["dtypes"] = session.target.dtype_choice.report()
    if curve is not None:
        report["widths"] = _widths_report(curve, main.stats, session.options.drafting.max_draft)
    if sweep:
        report["num_draft_sweep"] = _sweep(session, prompt_ids, sweep)
    if overhead_repeats:
        report["instrumentation"] = _instrumentation_cost(session, prompt_ids, overhead_repeats)
    if trace is not None:
        _write_trace(session, prompt_ids, trace)
        report["trace"] = str(trace)
    return report


def _widths_report(curve: cost.CostCurve, stats: DecodeStats, max_k: int) -> dict:
    """The cost curve, and the draft length it picks for the acceptance this run measured."""
    plain = curve.cost(1)
    draft_ms = 1000 * stats.phase_s.get("draft", 0.0) / stats.drafted if stats.drafted else 0.0
    chooser = AdaptiveDraftLength(curve, max_k)
    chooser.examined, chooser.accepted = _examined_and_accepted(stats, max_k)
    acceptance = chooser.acceptance() if stats.drafted else []
    return {
        "key": curve.key,
        "ms_by_width": {str(w): ms for w, ms in sorted(curve.ms_by_width.items())},
        "relative_to_width_1": {str(w): ms / plain for w, ms in sorted(curve.ms_by_width.items())},
        "draft_ms_per_token": draft_ms,
        "acceptance_by_position": acceptance,
        "best_num_draft": cost.best_draft_length(curve, acceptance, draft_ms, max_k, min_k=0) if acceptance else None,
    }


def _examined_and_accepted(stats: DecodeStats, max_k: int) -> tuple[list[int], list[int]]:
    """Per draft position: rounds that looked at it (all before it accepted) and accepted it,
    from the run's histogram of accepted drafts per round and drafts per position."""
    examined, accepted = [0] * max_k, [0] * max_k
    for position in range(min(max_k, len(stats.accepted_at))):
        accepted[position] = stats.accepted_at[position]
        reached = stats.accepted_at[position - 1] if position else stats.rounds
        examined[position] = min(reached, stats.drafted_at[position])
    return examined, accepted


def _time_split(summary: dict) -> dict:
    """Each phase's seconds and share of the wall: the parts of one whole, so they sum to it."""
    wall = summary["wall_s"] or 1.0
    return {phase: {"seconds": seconds, "share": seconds / wall} for phase, seconds in summary["time_s"].items()}


def _outside_forwards(summary: dict) -> dict:
    """What is not a model forward (verification, rollback, bookkeeping): a sum of `time_split`'s
    verify, rollback and other, reported beside the split rather than in it, which would count
    those phases twice."""
    wall = summary["wall_s"] or 1.0
    phases = [phase for phase in summary["time_s"] if phase not in FORWARD_PHASES]
    seconds = sum(summary["time_s"][phase] for phase in phases)
    return {"seconds": seconds, "share": seconds / wall, "phases": phases}


def _share_above(values: list[float], threshold: float) -> float:
    return sum(v > threshold for v in values) / len(values) if values else 0.0


def _sweep(session: Session, prompt_ids: list[int], lengths: list[int]) -> list[dict]:
    rows = []
    for k in lengths:
        result = session.run(prompt_ids, settings=dataclasses.replace(session.settings(), num_draft=k,
                                                                          adaptive_draft=False))
        stats = result.stats.summary()
        rows.append({"num_draft": k, "tokens_per_s": stats["tokens_per_s"], "mean_accepted": stats["mean_accepted"],
                     "acceptance_rate": stats["acceptance_rate"]})
    best = max(rows, key=lambda row: row["tokens_per_s"])
    for row in rows:
        row["best"] = row is best
    return rows


def _instrumentation_cost(session: Session, prompt_ids: list[int], repeats: int) -> dict:
    """What per-phase timing costs, two ways. Directly: the time of one lap, times the laps a
    decode makes (precise on a CPU; misses CUDA sync stalls). End to end: median wall time with
    laps on and off, interleaved (on, off, on, off ...), which includes everything but is only as
    precise as the machine is quiet."""
    from .decoding.stats import PHASES, PhaseClock

    probe = PhaseClock(torch.device("cpu"))
    laps = 20_000
    start = time.perf_counter()
    for _ in range(laps):
        probe.lap("other")
    per_lap = (time.perf_counter() - start) / laps
    timed, untimed, rounds = [], [], 0
    plain = dataclasses.replace(session.settings(), time_phases=False, record_margins=False)
    for _ in range(repeats):
        result = session.run(prompt_ids)
        timed.append(result.stats.wall_s)
        rounds = result.stats.rounds
        untimed.append(session.run(prompt_ids, settings=plain).stats.wall_s)
    on, off = statistics.median(timed), statistics.median(untimed)
    laps_per_round = len(PHASES) - 1  # every phase but the prefill, once per round
    return {
        "per_lap_s": per_lap,
        "estimated_share": per_lap * laps_per_round * rounds / on if on else 0.0,
        "with_laps_s": on,
        "without_laps_s": off,
        "measured_share": (on - off) / off,
        "repeats": repeats,
    }


def _write_trace(session: Session, prompt_ids: list[int], path: Path) -> None:
    import os

    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # keep the profiler's own log lines off the terminal
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if session.target.output_device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        session.run(prompt_ids)
    export_trace(prof.export_chrome_trace, path)


def export_trace(export: Callable[[str], object], path: Path) -> None:
    """Have `export` write the trace into a private directory beside `path`, check that it wrote
    something, and rename it into place. The profiler reports no failure (it said "written" for a
    file it could not write) and leaves its own 14 MB `.tmp` behind: both end here, with one
    sentence, the directory removed and an existing file at `path` untouched."""
    import os
    import shutil
    import tempfile

    from .errors import UserError

    try:
        folder = tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise UserError(f"cannot write the trace {path}: {exc.strerror or exc}") from None
    try:
        written = os.path.join(folder, "trace.json.gz" if path.name.endswith(".gz") else "trace.json")  # torch gzips
        export(written)
        if not os.path.isfile(written) or os.path.getsize(written) == 0:
            raise UserError(f"cannot write the trace {path}: the profiler wrote nothing")
        os.replace(written, path)
    except OSError as exc:
        raise UserError(f"cannot write the trace {path}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def plot_report(report: dict, path: Path) -> None:
    """Four panels: time split, accepted length per round, margins with theta, draft-length sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    phases = [p for p in report["stats"]["time_s"] if report["stats"]["time_s"][p] > 0]
    shares = [report["time_split"][p]["share"] * 100 for p in phases]
    axes[0, 0].barh(phases, shares, color="tab:blue")
    axes[0, 0].set_xlabel("% of wall time")
    axes[0, 0].set_title(f"where time goes ({report['stats']['tokens_per_s']:.1f} tokens/s)")
    histogram = report["accepted_length_histogram"]
    axes[0, 1].bar([int(k) for k in histogram], list(histogram.values()), color="tab:green")
    axes[0, 1].set_xticks([int(k) for k in histogram])
    axes[0, 1].set_xlabel("drafts accepted in a round")
    axes[0, 1].set_ylabel("rounds")
    axes[0, 1].set_title(f"accepted length (tau = {report['stats']['mean_accepted']:.2f})")
    values = [v for v in report["margins"]["values"] if v == v and abs(v) != float("inf")]
    axes[1, 0].hist(values, bins=40, color="tab:gray")
    axes[1, 0].axvline(report["margins"]["threshold"], color="tab:red", label=f"theta = {report['margins']['threshold']:.3f}")
    axes[1, 0].set_xlabel(f"margin ({report['margins']['measure']})")
    axes[1, 0].set_title("margins of generated positions")
    axes[1, 0].legend()
    sweep = report.get("num_draft_sweep")
    if sweep:
        axes[1, 1].plot([r["num_draft"] for r in sweep], [r["tokens_per_s"] for r in sweep], marker="o")
        axes[1, 1].set_xticks([r["num_draft"] for r in sweep])
        axes[1, 1].set_xlabel("num-draft k")
        axes[1, 1].set_ylabel("tokens/s")
        axes[1, 1].set_title("draft length sweep")
    else:
        rates = report["per_position_acceptance"]
        axes[1, 1].bar(range(1, len(rates) + 1), rates, color="tab:orange")
        axes[1, 1].set_xlabel("draft position")
        axes[1, 1].set_title("acceptance per draft position")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
