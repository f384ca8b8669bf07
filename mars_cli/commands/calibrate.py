"""`mars calibrate`: fit per-model MARS thresholds into a YAML profile."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from .. import calibration
from ..errors import require
from ..flags import decoding_flags
from ..notes import note
from ..options import DecodingOptions
from ..paths import claim_output
from ..render import calibration_table
from .common import check_writable_file, check_writable_profile, out, progress_bar, remove_leftovers, reproduce_command

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command("calibrate")
@decoding_flags("model", "draft", "num_draft", "margin", without=("device_map",),
                defaults={"draft": "auto", "num_draft": "4"})
def calibrate(
    *,
    options: DecodingOptions,  # the model flags, --draft, --num-draft and --margin (quality=), from @decoding_flags
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="JSONL prompt set (a 'prompt' field per line); default: the built-in set.")] = None,
    temperature: Annotated[float, typer.Option(
        "--temperature", help="Temperature of the sampled mode (recorded in the profile).")] = 1.0,
    modes: Annotated[str, typer.Option(
        "--modes", help="Decoding modes to fit: greedy (T = 0), sampled (--temperature) or both.")] = "greedy,sampled",
    samples: Annotated[int, typer.Option("--samples", help="Generated positions used to fit the thresholds.")] = 1500,
    held_out_samples: Annotated[Optional[int], typer.Option(
        "--held-out-samples", help="Positions from held-out prompts for the check (default: a third of --samples).")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        "--max-new-tokens", "-n", help="Length of each continuation (default 64; 48 for quality=).")] = None,
    objective: Annotated[str, typer.Option(
        "--objective", help="rate=R (share of low-margin positions), loss=L (nats/token bound) or quality=DROP "
                            "(most permissive theta whose task metrics stay within a relative DROP of strict).")] = calibration.DEFAULT_OBJECTIVE,
    suite: Annotated[str, typer.Option(
        "--suite", help="quality=: comma-separated suites with task metrics (math, summarize, translate, code, "
                        "or a .jsonl file).")] = calibration.DEFAULT_SUITES,
    limit: Annotated[str, typer.Option(
        "--limit", help="quality=: samples per suite, taken from its end (eval --limit takes the front), or auto: "
                        "more until the decision is clear (at most 32).")] = str(calibration.DEFAULT_LIMIT),
    thetas: Annotated[Optional[str], typer.Option(
        "--thetas", help="quality=: thresholds to sweep, e.g. 0.8,0.9,0.95 (default: five per --margin).")] = None,
    allow_code_execution: Annotated[bool, typer.Option(
        "--allow-code-execution", help="quality=: run generated code to score code suites (sandboxed).")] = False,
    weak_sandbox: Annotated[bool, typer.Option(
        "--weak-sandbox", help="Accept weaker isolation for generated code where namespaces are unavailable.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Random seed: the same seed gives the same profile.")] = 0,
    out_path: Annotated[Optional[Path], typer.Option(
        "--out", help="Where to write the YAML profile (default: the user profile directory).")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="Draw the sweep (tau and quality against theta, chosen point marked) to this PNG.")] = None,
    replot: Annotated[Optional[Path], typer.Option(
        "--replot", help="Draw the sweep stored in this profile to --plot, without calibrating.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON instead of a table.")] = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue an interrupted calibration with the same options and --out.")] = False,
) -> None:
    """Fit per-model MARS thresholds per decoding mode (a bound, or measured quality) into a YAML profile."""
    if replot is not None:
        require(plot is not None, "--replot PROFILE draws to --plot FILE: give both")
        check_writable_file(plot)
        calibration.replot(replot, plot)
        out.print(f"plot written to {plot}")
        return
    destination = out_path or calibration.default_destination(options.model.target)
    request = calibration.CalibrationRequest(destination, prompts=prompts, temperature=temperature, samples=samples,
                                             held_out_samples=held_out_samples, max_new_tokens=max_new_tokens,
                                             objective=objective, seed=seed, resume=resume, modes=modes, suite=suite,
                                             limit=limit, thetas=thetas, allow_code_execution=allow_code_execution,
                                             weak_sandbox=weak_sandbox)
    request.validate()
    options.drafting.validate()
    if plot is not None:
        require(request.quality, "--plot draws a quality= sweep; rate= and loss= fits have none")
        check_writable_file(plot)
    job = calibration.Calibration(options, request)  # reads the prompts (quality=: the suites)
    check_writable_profile(request.destination)
    claim_output(request.destination, "calibrate")  # its partial file too: one writer at a time
    remove_leftovers(request.destination, request.partial)
    job.load()  # the interrupted run's positions (--resume) and the target
    with progress_bar() as progress:
        def start_pass(stage: str, total: int) -> Callable[[int], None]:
            task = progress.add_task(stage, total=total)
            return lambda n: progress.advance(task, n)

        data, written = job.run(reproduce_command("calibrate"), start_pass, note)
    if plot is not None:
        calibration.plot_sweeps(data, plot)
    if as_json:
        sys.stdout.write(json.dumps({"profile": str(written), **data}) + "\n")
        return
    for table in calibration_table(data):
        out.print(table)
    out.print(f"profile written to {written}" + (f"; plot written to {plot}" if plot is not None else ""))
