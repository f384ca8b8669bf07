"""Ask the warm server to decode a request, or start one. Light to import (no torch): this is
what a warm one-liner runs besides typer and rich.

Requests and events are JSON lines over the socket. The request carries the options by flat name,
the prompt, the working directory (relative paths mean what they mean here), this code's stamp
and the seconds this process spent starting. The server answers `{"hello": PID, "reused": BOOL}`,
or `{"stale": true}` when its code or environment is not this one (it then exits), then the
generation events (generation.py), `{"stderr": LINE}` for its notes, and `{"error": TEXT}` for a
refusal.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from . import address as addresses
from .address import Address

MAX_LINE = 128 << 20  # an event or request line: a 64 MiB prompt, JSON-escaped, fits


class ServerLost(Exception):
    """The server closed the connection before the request was done."""


def connect(address: Address) -> socket.socket | None:
    """A connection to the live server, or None (no socket file, or nobody listening on it)."""
    if not address.socket.exists():
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(address.socket))
    except OSError:
        connection.close()
        return None
    return connection


def events(connection: socket.socket, request: dict) -> Iterator[dict]:
    """Send `request`, then yield the server's events until the connection ends. A `stale`
    answer ends it at once; an end before `done` or `error` raises ServerLost."""
    connection.sendall(json.dumps(request, ensure_ascii=False).encode("utf-8") + b"\n")
    finished = False
    with connection.makefile("rb") as lines:
        while True:
            line = lines.readline(MAX_LINE)
            if not line:
                break
            event = json.loads(line)
            yield event
            if "done" in event or "error" in event or "stale" in event:
                finished = True
                break
    if not finished:
        raise ServerLost("the warm server closed the connection mid-request")


def start(address: Address, preload: dict | None) -> int | None:
    """Start a server for this environment in the background (its own session, no terminal),
    preloading `preload`'s options; its pid, or None where it could not be started. It exits after
    the idle timeout, or at once if another server holds the lock."""
    command = [sys.executable, "-m", "mars_cli.warm.server", "--key", address.key]
    if preload is not None:
        command += ["--preload", json.dumps(preload)]
    try:
        with open(address.log, "ab") as log:
            os.chmod(address.log, 0o600)
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True,
                                       start_new_session=True, cwd=os.getcwd(), env=_server_environment())
    except OSError:
        return None
    return process.pid


def _server_environment() -> dict[str, str]:
    """This environment, less what would make the server talk to a terminal."""
    environment = dict(os.environ)
    environment.pop("COLUMNS", None)
    environment.pop("LINES", None)
    return environment


def request_for(address: Address, options: dict, text: str, as_json: bool, import_s: float | None) -> dict:
    """The request line for one `mars generate`."""
    return {"protocol": addresses.PROTOCOL, "stamp": addresses.code_stamp(), "key": address.key,
            "cwd": os.getcwd(), "options": options, "text": text, "stream": not as_json, "import_s": import_s}


def stop(address: Address) -> bool:
    """Ask the live server to exit; whether one answered."""
    connection = connect(address)
    if connection is None:
        return False
    with connection:
        try:
            connection.sendall(b'{"stop": true}\n')
            connection.recv(64)
        except OSError:
            pass
    return True


def socket_path_ok(path: Path) -> bool:
    """AF_UNIX paths are limited to about 107 bytes."""
    return len(os.fsencode(str(path))) < 100
