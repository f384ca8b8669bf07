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
    if mode == "on" and place is None and (problem := addresses.folder_problem(addresses.folder())) is not None:
        note(f"MARS_SERVER=on, but {addresses.folder()} {problem}: no warm server is used; decoding in this process")
    answered = _on_warm_server(place, options, text, as_json, show_stats, import_s) if place is not None else ABSENT
    if answered == SERVED:
        return
    _in_process(options, text, as_json, show_stats)
    if mode == "auto" and place is not None and answered == ABSENT:
        _start_warm_server(place, options)


def _in_process(options: DecodingOptions, text: str, as_json: bool, show_stats: bool) -> None:
    from .. import generation  # torch, transformers: the cold start's imports
    from ..startup import Startup

    startup = Startup()  # its import phase: this process's age now, the heavy imports included
    session = generation.build(options, startup)
    _render(generation.events(session, text, startup, stream_text=not as_json), as_json, show_stats, None)


SERVED, ABSENT, DECLINED = "served", "absent", "declined"  # DECLINED: a live server that did not decode it
DIED_AFTER_OUTPUT = 75  # the server died after text was printed: the answer is cut (EX_TEMPFAIL: run again)


def _on_warm_server(place, options: DecodingOptions, text: str, as_json: bool, show_stats: bool,  # type: ignore[no-untyped-def]
                    import_s: float | None) -> str:
    """Decode on the warm server at `place` if one is live: SERVED; ABSENT where none is (or it was
    stale); DECLINED where it was busy, or went away or failed before anything was printed
    (nothing printed: this process then decodes the request itself)."""
    from ..warm import client

    flat = options.flat()
    flat["stop"] = list(options.stop)
    request = client.request_for(place, flat, text, as_json, import_s)
    connection = client.connect(place)
    if connection is None:
        return ABSENT
    with connection:
        replies = client.events(connection, request)
        try:
            first = next(replies)
        except (client.ServerLost, StopIteration):
            return DECLINED  # it went away before answering: decode here
        if "stale" in first:
            return ABSENT
        if "busy" in first:
            return DECLINED
        server = {"pid": first.get("hello"), "session": "reused" if first.get("reused") else "built"}
        progress = _Shown()
        try:
            _render(_with(first, replies), as_json, show_stats, server, progress)
        except (client.ServerLost, _ServerFailed):
            if not progress.text:
                return DECLINED
            _cut_short(place)
    return SERVED


class _Shown:
    """Whether any of the answer's text reached stdout (then it cannot be decoded again here)."""

    text = False


class _ServerFailed(Exception):
    """The server failed on its own account (not the request's): code 1."""


def _cut_short(place) -> None:  # type: ignore[no-untyped-def]
    """The server died mid-answer, after some text was printed: end the line, say so, exit 75."""
    out.print()
    print(f"mars: error: the warm server stopped mid-answer, the text above is incomplete (its log: {place.log}); "
          "run again, or set MARS_SERVER=off to decode in this process", file=sys.stderr)
    raise typer.Exit(DIED_AFTER_OUTPUT)


def _with(first: dict, rest):
    yield first
    yield from rest


def _render(events, as_json: bool, show_stats: bool, server: dict | None, printed: _Shown | None = None) -> None:
    """Print a request's events: text as it comes, notes on stderr, then the JSON or the table."""
    streaming = False
    printed = printed or _Shown()
    try:
        for event in events:
            if "delta" in event:
                streaming = True
                printed.text = printed.text or bool(event["delta"])
                out.print(shown(event["delta"]), end="", markup=False, highlight=False)
            elif "ended" in event and not as_json:
                out.print()
                streaming = False
            elif "stderr" in event:  # the server's notes, already shown-safe (notes.py)
                print(event["stderr"], file=sys.stderr, flush=True)
            elif "error" in event:
                if event.get("code", 2) == 2:
                    raise UserError(event["error"])
                raise _ServerFailed(event["error"])
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

    if addresses.socket_problem(place.socket) is not None:
        return
    flat = options.flat()
    flat["stop"] = list(options.stop)
    process = client.start(place, flat)
    if process is not None:
        note(f"started a warm server (pid {process.pid}) so the next `mars generate` starts in about a second; it exits "
             f"after {addresses.idle_timeout_s() / 60:g} idle minutes (MARS_SERVER=off: never)", once=True)
