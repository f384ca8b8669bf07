"""Ask the warm server to decode a request, or start one. Light to import (no torch): this is
what a warm one-liner runs besides typer and rich.

Requests and events are JSON lines over the socket. The request carries the options by flat name,
the prompt, the working directory (relative paths mean what they mean here), this code's stamp
and the seconds this process spent starting. The server answers `{"hello": PID, "reused": BOOL}`,
`{"busy": true}` when another request holds it (the client then decodes itself), or
`{"stale": true}` when its code or environment is not this one (it then exits); then the
generation events (generation.py), `{"stderr": LINE}` for its notes, and `{"error": TEXT, "code": N}`
for a refusal (2) or a failure of its own (1).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from . import address as addresses
from .address import Address

MAX_LINE = 128 << 20  # an event or request line: a 64 MiB prompt, JSON-escaped, fits
FIRST_EVENT_S = 30.0  # a server that says nothing for this long after a request is not used
STOP_S = 10.0  # `--stop`: the server's answer, then its exit, within this each


class ServerLost(Exception):
    """The server closed the connection (or died) before the request was done."""


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


def peer(connection: socket.socket) -> tuple[int, int] | None:
    """The other end's (pid, uid) (Linux SO_PEERCRED), or None where it cannot be read."""
    try:
        credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    pid, uid, _ = struct.unpack("3i", credentials)
    return pid, uid


def events(connection: socket.socket, request: dict, first_event_s: float = FIRST_EVENT_S) -> Iterator[dict]:
    """Send `request`, then yield the server's events until the connection ends. The first comes
    within `first_event_s` or the server is lost; a `stale` or `busy` answer ends it at once; an
    end before `done` or `error` (a reset, a line that is not JSON) raises ServerLost."""
    try:
        connection.settimeout(first_event_s)
        connection.sendall(json.dumps(request, ensure_ascii=False).encode("utf-8") + b"\n")
        with connection.makefile("rb") as lines:
            yield from _replies(lines, connection)
    except (OSError, ValueError) as exc:  # socket.timeout is an OSError
        raise ServerLost(f"the warm server did not answer ({type(exc).__name__})") from None


def _replies(lines, connection: socket.socket) -> Iterator[dict]:  # type: ignore[no-untyped-def]
    first = True
    while True:
        line = lines.readline(MAX_LINE)
        if not line:
            raise ServerLost("the warm server closed the connection mid-request")
        event = json.loads(line)
        if not isinstance(event, dict):
            raise ValueError("an event that is not a JSON object")
        if first:  # the server answered: from here a build or a long decode may take its time
            connection.settimeout(None)
            first = False
        yield event
        if "done" in event or "error" in event or "stale" in event or "busy" in event:
            return


def start(address: Address, preload: dict | None) -> subprocess.Popen | None:
    """Start a server for this environment in the background (its own session, no terminal),
    preloading `preload`'s options; the process, or None where it could not be started. It exits
    after the idle timeout, or at once if another server holds the lock."""
    command = [sys.executable, "-m", "mars_cli.warm.server", "--key", address.key]
    if preload is not None:
        command += ["--preload", json.dumps(preload)]
    try:
        with open(address.log, "ab") as log:
            os.chmod(address.log, 0o600)
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True,
                                    start_new_session=True, cwd=os.getcwd(), env=_server_environment())
    except OSError:
        return None


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


def stop(address: Address) -> int | None:
    """Ask the live server to exit and wait until it has (its memory is free then); its pid, or
    None where no server of this user's answered. One that does not answer in time is sent SIGTERM,
    one that is still there after that SIGKILL."""
    connection = connect(address)
    if connection is None:
        return None
    with connection:
        who = peer(connection)
        if who is None or who[1] != os.getuid():  # never signal, or trust, another user's process
            return None
        connection.settimeout(STOP_S)
        try:
            connection.sendall(b'{"stop": true}\n')
            connection.recv(64)
        except OSError:
            with contextlib.suppress(OSError):  # gone already
                os.kill(who[0], signal.SIGTERM)
    if not _wait_gone(who[0], STOP_S):
        with contextlib.suppress(OSError):
            os.kill(who[0], signal.SIGKILL)
        _wait_gone(who[0], STOP_S)
    return who[0]


def _wait_gone(pid: int, seconds: float) -> bool:
    """Whether process `pid` has ended within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or _zombie(pid):
            return True
        time.sleep(0.05)
    return False


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def wait_listening(address: Address, process: subprocess.Popen, seconds: float) -> str | None:
    """After `start`: None once the server answers on its socket; else why not, in a phrase (it
    exited, with its log's last line, or it did not answer in time)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        connection = connect(address)
        if connection is not None:
            connection.close()
            return None
        code = process.poll()
        if code is not None:
            return f"it exited at once (status {code}: {last_log_line(address)})"
        time.sleep(0.05)
    return f"it did not answer within {seconds:g} s (its log: {address.log})"


def last_log_line(address: Address) -> str:
    """The server log's last line, less its time stamp, or a pointer to the log."""
    try:
        lines = address.log.read_bytes()[-4096:].decode("utf-8", "replace").strip().splitlines()
    except OSError:
        lines = []
    if not lines:
        return f"see {address.log}"
    return lines[-1].split("] ", 1)[-1]
