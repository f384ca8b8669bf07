"""`mars serve`: a target behind vLLM's OpenAI-compatible server, drafts verified by MARS."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from ..errors import UserError, require
from ..flags import DECODING, MODEL, SAMPLING, decoding_flags
from ..notes import note, warn
from ..options import DecodingOptions

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


SERVE_HELP = (
    "Serve a target with vLLM's OpenAI-compatible server (`vllm serve`), speculative decoding verified by MARS "
    "with the target's calibrated threshold.\n\n"
    "Prints each choice on stderr (target directory, speculative config, MARS's thresholds), then becomes "
    "`vllm serve`. It listens on 127.0.0.1 (this machine only) unless --host says otherwise, and warns when a "
    "server others can reach has no --api-key. Flags mars does not know (--api-key, --tensor-parallel-size, "
    "--enforce-eager, ...) and everything after `--` go to `vllm serve` unchanged, after mars's own. Needs vLLM "
    "in this environment (`make setup-vllm`); --dry-run does not.\n\n"
    "`mars serve --local` instead starts this user's warm server for `mars generate` (a private Unix socket, no "
    "network): it keeps models loaded between one-liners and exits after MARS_SERVER_IDLE_S idle seconds (900); "
    "`--local --stop` stops it.")


@app.command("serve", help=SERVE_HELP, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@decoding_flags("verification", defaults={"verify": "mars"})
def serve(
    ctx: typer.Context,
    target_arg: Annotated[Optional[str], typer.Argument(
        metavar="TARGET", show_default=False,
        help="Target model, as --target: embedded name, repo id, model directory or .gguf file (default "
             "smollm2-135m). Before any pass-through flag.")] = None,
    *,
    target: Annotated[Optional[str], typer.Option(
        "--target", rich_help_panel=MODEL, show_default=False, help="The target, as TARGET.")] = None,
    draft: Annotated[str, typer.Option(
        "--draft", rich_help_panel=DECODING,
        help="Drafter: 'head' (the target's EAGLE-3 head), 'head:DIR', 'ngram' (prompt lookup), 'none', or a "
             "draft model spec sharing the target's vocabulary.")] = "head",
    num_draft: Annotated[int, typer.Option(
        "--num-draft", rich_help_panel=DECODING, help="Tokens drafted per round (1-16).")] = 3,
    options: DecodingOptions,  # --verify (default mars), --threshold, --margin, --calibration, --force
    dtype: Annotated[str, typer.Option(
        "--dtype", rich_help_panel=MODEL,
        help="auto (vLLM's choice: float32 weights run in bfloat16 on CPU and recent GPUs), float32 (the exact "
             "mode), bfloat16 or float16.")] = "auto",
    max_model_len: Annotated[Optional[int], typer.Option(
        "--max-model-len", rich_help_panel=MODEL, show_default=False,
        help="Longest sequence (prompt and output) served; default: the model's context length.")] = None,
    seed: Annotated[Optional[int], typer.Option(
        "--seed", rich_help_panel=SAMPLING, show_default=False,
        help="vLLM's random seed (default: vLLM's, 0).")] = None,
    host: Annotated[str, typer.Option(
        "--host", help="Address to listen on: 127.0.0.1 (this machine only) unless given; 0.0.0.0 for every "
                       "interface (then pass --api-key too).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8000,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Resolve everything, print the `vllm serve` command on stdout and exit.")] = False,
    local: Annotated[bool, typer.Option(
        "--local", help="Start the warm server `mars generate` uses (models kept loaded between calls; a private "
                        "Unix socket) in the background instead, and exit.")] = False,
    stop: Annotated[bool, typer.Option("--stop", help="With --local: stop the warm server.")] = False,
) -> None:
    """Serve a target with vLLM's OpenAI-compatible server, drafts verified by MARS (SERVE_HELP has the rest)."""
    if local or stop:
        require(local, "--stop stops the warm server: mars serve --local --stop")
        _local(stop)
        return
    from ..serving import engine
    from ..serving.serve import ServeRequest, exec_vllm, plan, split_target

    chosen, passthrough = split_target(target_arg, target, ctx.args)
    request = ServeRequest(chosen, draft, num_draft, options.verification, dtype, max_model_len, seed, passthrough,
                           host, port)
    request.validate()
    if not dry_run:
        engine.require_vllm()  # before the target converts, not after
    serve_plan = plan(request)
    for line in serve_plan.choices():
        note(line)
    if (exposure := serve_plan.exposure()) is not None:
        warn(exposure)
    if dry_run:
        sys.stdout.write(serve_plan.shell() + "\n")
        return
    note(f"running: {serve_plan.shell()}")
    exec_vllm(serve_plan)


START_S = 30.0  # `mars serve --local`: the new server answers on its socket within this, or it failed


def _local(stop: bool) -> None:
    """`mars serve --local [--stop]`: the warm server of this environment (warm/)."""
    from ..warm import address as addresses

    if stop:
        _stop_local()
        return
    place = addresses.here(create=True)
    if place is None:
        folder = addresses.folder()
        raise UserError(f"{folder} {addresses.folder_problem(folder) or 'cannot be made'}: no warm server")
    _start_local(place)


def _start_local(place) -> None:  # type: ignore[no-untyped-def]
    """Start the server, and say so only once it answers: where it cannot listen, why, exit 2."""
    from ..warm import address as addresses
    from ..warm import client

    problem = addresses.socket_problem(place.socket)
    if problem is not None:
        raise UserError(f"cannot start the warm server: {problem}")
    live = client.connect(place)
    if live is not None:
        live.close()
        note(f"a warm server is already listening on {place.socket}")
        return
    process = client.start(place, None)
    if process is None:
        raise UserError(f"could not start the warm server (its log: {place.log})")
    why = client.wait_listening(place, process, START_S)
    if why is not None:
        raise UserError(f"the warm server did not start: {why}")
    note(f"warm server started (pid {process.pid}) on {place.socket}; it exits after {addresses.idle_timeout_s():g} "
         f"idle seconds; log: {place.log}")


def _stop_local() -> None:
    """Stop this user's server, found by its socket even in a folder opened up since it started
    (it still holds its memory there); a folder of another user's is said to be one."""
    from ..warm import address as addresses
    from ..warm import client

    folder = addresses.folder()
    problem = addresses.folder_problem(folder)
    if not addresses.owned_folder(folder):
        note(f"no warm server was running ({folder} {problem})" if problem else "no warm server was running")
        return
    pid = client.stop(addresses.Address(folder, addresses.environment_key()))
    if pid is None:
        note("no warm server was running")
    else:
        note(f"warm server stopped (pid {pid})")
    if problem is not None:
        note(f"{folder} {problem}: no warm server is used until it is private again")
