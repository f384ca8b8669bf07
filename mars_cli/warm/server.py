"""The warm server: keeps sessions (loaded targets, drafters, tuning choices) across `mars
generate` calls of one user, on a private Unix socket, one request at a time.

Started by a cold `mars generate` (MARS_SERVER=auto) or `mars serve --local`; exits after the idle
timeout, on `mars serve --local --stop`, or when a client with other code asks (its stamp differs).
Only the user who owns it may talk to it (the socket is 0600 in a 0700 folder, and each
connection's peer uid is checked). It never listens on a network.

    python -m mars_cli.warm.server --key KEY [--preload OPTIONS_JSON]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import os
import signal
import socket
import struct
import sys
import time
import traceback
from collections import OrderedDict

from . import address as addresses
from .address import Address
from .client import MAX_LINE

KEPT_SESSIONS = 2  # sessions kept loaded (each may hold its own target: a 135M model is ~0.6 GB)


class EventStream(io.TextIOBase):
    """A text stream (the request's stderr) whose lines travel to the client as events."""

    def __init__(self, send) -> None:
        self.send, self.pending = send, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            self.send({"stderr": line})
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.send({"stderr": self.pending})
            self.pending = ""


class Server:
    def __init__(self, address: Address, idle_s: float) -> None:
        self.address, self.idle_s = address, idle_s
        self.stamp = addresses.code_stamp()
        self.sessions: OrderedDict[str, object] = OrderedDict()
        self.listener: socket.socket | None = None
        self.running = True

    # ------------------------------------------------------------------ lifetime
    def listen(self) -> bool:
        """Bind the socket (replacing a stale one: the lock says none is live); False when another
        server holds the lock."""
        self.lock = open(self.address.lock, "a+b")
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.address.socket)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_mask = os.umask(0o177)
        try:
            listener.bind(str(self.address.socket))
        finally:
            os.umask(old_mask)
        listener.listen(16)
        self.listener, self.inode = listener, os.stat(self.address.socket).st_ino
        return True

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            with contextlib.suppress(OSError):
                if os.stat(self.address.socket).st_ino == self.inode:  # still ours
                    os.unlink(self.address.socket)

    def run(self) -> None:
        while self.running:
            self.listener.settimeout(self.idle_s)
            try:
                connection, _ = self.listener.accept()
            except socket.timeout:
                log("idle: exiting")
                return
            with connection:
                connection.settimeout(None)
                if _peer_uid(connection) != os.getuid():
                    continue
                self.handle(connection)

    # ------------------------------------------------------------------ one request
    def handle(self, connection: socket.socket) -> None:
        def send(event: dict) -> None:
            connection.sendall(json.dumps(event, ensure_ascii=False).encode("utf-8") + b"\n")

        try:
            with connection.makefile("rb") as lines:
                request = json.loads(lines.readline(MAX_LINE) or b"{}")
            if request.get("stop"):
                self.running = False
                send({"stopped": os.getpid()})
                return
            if (request.get("protocol"), request.get("stamp"), request.get("key")) != \
                    (addresses.PROTOCOL, self.stamp, self.address.key):
                send({"stale": True})
                self.running = False  # another version's client: make way for its own server
                return
            self.generate(request, send)
        except (BrokenPipeError, ConnectionResetError):
            log("client went away mid-request")
        except (ValueError, KeyError, TypeError) as exc:
            log(f"bad request: {exc}")

    def generate(self, request: dict, send) -> None:
        from ..errors import UserError
        from ..options import DecodingOptions
        from ..startup import Startup
        from ..tuning.clock import TALLY
        from .. import generation

        os.chdir(request["cwd"])
        stream = EventStream(send)
        with contextlib.redirect_stderr(stream):
            try:
                options = DecodingOptions.of(**request["options"])
                options.validate()
                startup = Startup(request.get("import_s"), TALLY.seconds, measure_import=False)
                key = json.dumps([request["cwd"], options.flat()], sort_keys=True, default=str)
                session = self.sessions.get(key)
                send({"hello": os.getpid(), "reused": session is not None})
                if session is None:
                    session = generation.build(options, startup)
                    self.keep(key, session)
                else:
                    self.sessions.move_to_end(key)
                    session.as_fresh()  # this one-liner decoded as its own process would
                    startup.built(TALLY.seconds)
                for event in generation.events(session, request["text"], startup, request.get("stream", True)):
                    stream.flush()
                    send(event)
            except UserError as exc:
                stream.flush()
                send({"error": str(exc), "code": 2})
            except (BrokenPipeError, ConnectionResetError):
                raise
            except Exception as exc:  # the client shows one line; the traceback goes to the log
                log("".join(traceback.format_exception(exc)))
                stream.flush()
                send({"error": f"the warm server failed: {type(exc).__name__}: {exc} (log: {self.address.log})",
                      "code": 1})

    def keep(self, key: str, session: object) -> None:
        self.sessions[key] = session
        while len(self.sessions) > KEPT_SESSIONS:
            self.sessions.popitem(last=False)

    def preload(self, flat_options: dict) -> None:
        """Build the session the starting command used, before the first request asks for it."""
        from ..options import DecodingOptions
        from ..startup import Startup
        from .. import generation

        try:
            options = DecodingOptions.of(**flat_options)
            session = generation.build(options, Startup(measure_import=False))
        except Exception as exc:  # noqa: BLE001 - the request will meet (and show) the same problem
            log(f"preload failed: {exc}")
            return
        self.keep(json.dumps([os.getcwd(), options.flat()], sort_keys=True, default=str), session)


def _peer_uid(connection: socket.socket) -> int | None:
    """The connecting process's uid (Linux SO_PEERCRED), or None where it cannot be read."""
    try:
        credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", credentials)[1]


def log(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{os.getpid()}] {text}", file=sys.__stderr__, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mars_cli.warm.server")
    parser.add_argument("--key", required=True, help="the environment key the client computed")
    parser.add_argument("--preload", help="a session's options (flat names, JSON) to build first")
    args = parser.parse_args(argv)
    place = addresses.folder()
    if not addresses.private_folder(place, create=True):
        log(f"{place} is not a private folder: not serving")
        return 2
    server = Server(Address(place, args.key), addresses.idle_timeout_s())
    if not server.listen():
        return 0  # another server is live
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log(f"listening on {server.address.socket} (idle timeout {server.idle_s:g} s)")
    try:
        if args.preload:
            server.preload(json.loads(args.preload))
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
