"""`mars profile`: where decoding time goes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import require
from ..flags import DECODING_FLAGS, decoding_flags
from ..options import DecodingOptions
from .common import check_writable_file, out, valid_utf8

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command("profile")
@decoding_flags(*DECODING_FLAGS, "raw", defaults={"draft": "ngram"})
def profile_command(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt (default: a built-in summarisation prompt).")] = None,
    *,
    sweep_num_draft: Annotated[Optional[str], typer.Option(
        "--sweep-num-draft", help="Also run each draft length, e.g. 1:8 or 2,4,8, and show the best.")] = None,
    bucket: Annotated[int, typer.Option("--bucket", help="Output positions per tokens/s bucket.")] = 32,
    overhead_repeats: Annotated[int, typer.Option(
        "--overhead-repeats", help="Runs with and without per-phase timing to measure its own cost (0: skip).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write the charts to this PNG file.")] = None,
    trace: Annotated[Optional[Path], typer.Option(
        "--trace", help="Write a torch.profiler trace (open in chrome://tracing or Perfetto).")] = None,
    widths: Annotated[bool, typer.Option(
        "--widths", help="Measure the target's forward cost by verification width (1-16) afresh, cache it for "
                         "--num-draft auto, and show the draft length it picks for this run's acceptance.")] = False,
    dtypes: Annotated[bool, typer.Option(
        "--dtypes", help="Measure a plain decoding step of the target in each dtype (float32, bfloat16; float16 "
                         "too on a GPU; q4 and q4a8 for a GGUF on a CPU with the q4 kernels) and check each one's output against float32's, afresh; cache the choice "
                         "for --dtype auto and show the table.")] = False,
    options: DecodingOptions,  # the shared flags, from @decoding_flags
) -> None:
    """Show where decoding time goes: time split, acceptance, margins, draft-length sweep."""
    from ..profiling import DEFAULT_PROMPT, parse_range, plot_report, run_profile
    from ..session import Session
    from ..render import profile_tables

    options.validate()  # --seed too (check_seed)
    prompt = None if prompt is None else valid_utf8(prompt, "the prompt argument")
    sweep = parse_range(sweep_num_draft) if sweep_num_draft else None
    require(bucket >= 1, f"--bucket must be at least 1, got {bucket}")
    require(overhead_repeats >= 0, f"--overhead-repeats must be >= 0, got {overhead_repeats}")
    for path in (plot, trace):
        if path is not None:
            check_writable_file(path)
    require(not (dtypes and options.model.device_map), "--dtypes measures a target on one device: drop --device-map")
    # --dtypes measures for speculative decoding unless --draft none
    session = Session(options, options.model.load(measure_dtypes=True, speculative=options.drafting.drafts)
                      if dtypes else None)
    report = run_profile(session, prompt or DEFAULT_PROMPT, sweep, bucket, overhead_repeats, trace, widths, dtypes)
    if plot is not None:
        plot_report(report, plot)
        report["plot"] = str(plot)
    if as_json:
        sys.stdout.write(json.dumps(report) + "\n")
        return
    for table in profile_tables(report):
        out.print(table)
    for key in ("plot", "trace"):
        if key in report:
            out.print(f"{key} written to {report[key]}")
