"""`mars tune`: measure every choice `auto` makes on this machine, and cache them."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ..flags import decoding_flags
from ..options import DecodingOptions
from .common import err, out

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command("tune")
@decoding_flags("model", without=("device_map", "compile", "packed_weights", "dtype"))
def tune_command(
    *,
    options: DecodingOptions,  # --target, --device and the trust flags, from @decoding_flags
    as_json: Annotated[bool, typer.Option("--json", help="Print the choices as one JSON object.")] = False,
) -> None:
    """Measure every choice `auto` makes for the target on this machine (dtype, packed linears, cost
    curve, int8 head; with --engine llama.cpp its thread count and cost curve), afresh and
    unbounded, and cache them: run it once after installing, and again after the machine changes.
    Later runs then measure nothing."""
    import torch
    from rich.progress import Progress

    from ..render import tune_table
    from ..tuning import machine, tune

    options.validate()
    if options.model.engine == "llama.cpp":  # its own choices: threads, then the width curve
        target = options.model.load()
    else:
        target = options.model.load(dtype=torch.float32)  # the reference every dtype is measured from
    with Progress(console=err, transient=True, disable=as_json) as progress:
        task = progress.add_task("tuning", total=len(tune.steps(target, options.model.allow_pickle)))
        rows = tune.run(target, options.model.allow_pickle,
                        lambda done, name: progress.update(task, completed=done, description=f"measuring the {name}"))
    facts = machine.machine_facts()
    if as_json:
        sys.stdout.write(json.dumps({"machine": facts, "target": target.spec, "choices": rows}) + "\n")
        return
    out.print(tune_table(rows, facts))
