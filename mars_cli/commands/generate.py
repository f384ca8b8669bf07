"""`mars generate`: stream a continuation of a prompt.

A one-liner's start-up is mostly torch's import and the model's load, so by default (MARS_SERVER,
warm/address.py) the command first asks this user's warm server, which keeps sessions loaded,
and decodes in its own process only where none is running; it then starts one for the next call.
Either way the same events (generation.py) are rendered here. This module imports nothing heavy
until it decodes in-process.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

from ..errors import UserError
from ..flags import DECODING_FLAGS, decoding_flags
from ..notes import note
from ..options import DecodingOptions
from ..terminal import shown
from .common import err, out, read_prompt

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command("generate")
@decoding_flags(*DECODING_FLAGS, "stop", "raw", defaults={"draft": "auto", "engine": "auto"})
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; '-' or nothing reads stdin.")] = None,
    *,
    options: DecodingOptions,  # the shared flags, from @decoding_flags
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (text, config, stats) instead of streaming.")] = False,
    show_stats: Annotated[bool, typer.Option("--stats", help="Print decoding statistics as a table after the text.")] = False,
) -> None:
    """Generate a continuation of PROMPT, streaming the text as it is decoded."""
    from ..startup import process_age_s

    import_s = process_age_s()
    options.validate()  # --seed too (check_seed)
    text = read_prompt(prompt)
    from ..warm import address as addresses

    mode = addresses.mode()
    # read before anything heavy is imported: torch sets environment variables the key reads
    place = addresses.here(create=mode == "auto") if mode != "off" else None
    if place is not None and _on_warm_server(place, options, text, as_json, show_stats, import_s):
        return
    _in_process(options, text, as_json, show_stats)
    if mode == "auto" and place is not None:
        _start_warm_server(place, options)


def _in_process(options: DecodingOptions, text: str, as_json: bool, show_stats: bool) -> None:
    from .. import generation  # torch, transformers: the cold start's imports
    from ..startup import Startup

    startup = Startup()  # its import phase: this process's age now, the heavy imports included
    session = generation.build(options, startup)
    _render(generation.events(session, text, startup, stream_text=not as_json), as_json, show_stats, None)


def _on_warm_server(place, options: DecodingOptions, text: str, as_json: bool, show_stats: bool,  # type: ignore[no-untyped-def]
                    import_s: float | None) -> bool:
    """Decode on the warm server at `place` if one is live; False (nothing printed) where none answers."""
    from ..warm import client

    connection = client.connect(place)
    if connection is None:
        return False
    flat = options.flat()
    flat["stop"] = list(options.stop)
    request = client.request_for(place, flat, text, as_json, import_s)
    server: dict = {}
    with connection:
        replies = client.events(connection, request)
        try:
            first = next(replies)
        except (client.ServerLost, OSError, ValueError, StopIteration):
            return False  # it went away before answering: decode here
        if "stale" in first:
            return False
        if "hello" in first:
            server = {"pid": first["hello"], "session": "reused" if first.get("reused") else "built"}
        try:
            _render(_with(first, replies), as_json, show_stats, server)
        except client.ServerLost:
            raise UserError(f"the warm server stopped mid-request (its log: {place.log}); run again, or set "
                            "MARS_SERVER=off to decode in this process") from None
    return True


def _with(first: dict, rest):
    yield first
    yield from rest


def _render(events, as_json: bool, show_stats: bool, server: dict | None) -> None:
    """Print a request's events: text as it comes, notes on stderr, then the JSON or the table."""
    streaming = False
    try:
        for event in events:
            if "delta" in event:
                streaming = True
                out.print(shown(event["delta"]), end="", markup=False, highlight=False)
            elif "ended" in event and not as_json:
                out.print()
                streaming = False
            elif "stderr" in event:  # the server's notes, already shown-safe (notes.py)
                print(event["stderr"], file=sys.stderr, flush=True)
            elif "error" in event:
                if event.get("code", 2) == 2:
                    raise UserError(event["error"])
                raise RuntimeError(event["error"])
            elif "done" in event:
                payload = {**event["done"], "server": server}
                if as_json:
                    sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")
                elif show_stats:
                    from ..render import stats_table

                    err.print(stats_table(payload["stats"], payload["config"], server))
    except KeyboardInterrupt:
        if streaming:
            out.print()
        raise


def _start_warm_server(place, options: DecodingOptions) -> None:  # type: ignore[no-untyped-def]
    """After a cold run: a warm server for the next call, with this call's session preloaded."""
    from ..warm import address as addresses
    from ..warm import client

    if not client.socket_path_ok(place.socket):
        return
    flat = options.flat()
    flat["stop"] = list(options.stop)
    pid = client.start(place, flat)
    if pid is not None:
        note(f"started a warm server (pid {pid}) so the next `mars generate` starts in about a second; it exits "
             f"after {addresses.idle_timeout_s() / 60:g} idle minutes (MARS_SERVER=off: never)", once=True)
