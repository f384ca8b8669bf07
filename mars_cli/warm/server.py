"""The warm server: keeps sessions (loaded targets, drafters, tuning choices) across `mars
generate` calls of one user, on a private Unix socket.

Started by a cold `mars generate` (MARS_SERVER=auto) or `mars serve --local`; exits after the idle
timeout, on `mars serve --local --stop`, or when a client with other code asks (its stamp differs).
Only the user who owns it may talk to it (the socket is 0600 in a 0700 folder, and each
connection's peer uid is checked). It never listens on a network.

Connections are taken on a thread of their own, each request read on its own thread within a few
seconds (channel.py), so `--stop` is always answered and no client can keep another waiting. The
main thread decodes, one request at a time; a request that cannot have it within WAIT_S is told
`busy` and decodes in its own process. Between requests the server stands in "/", not in a
client's folder. What each session is reused for is sessions.py's.

    python -m mars_cli.warm.server --key KEY [--preload OPTIONS_JSON]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback

from .. import reads
from . import address as addresses
from . import sessions as kept_sessions
from .address import Address
from .channel import BadRequest, Channel, ClientGone

KEPT_SESSIONS = 2  # sessions kept loaded (each may hold its own target: a 135M model is ~0.6 GB)
WAIT_S = 2.0  # a request waits this long for the decoding to be free, then decodes in its own process
POLL_S = 0.5  # how often the main and accepting threads look at the clock and the stop flag
STOP_GRACE_S = 5.0  # after `--stop`, a build that cannot be interrupted gets this long, then the process ends
MOST_CLIENTS = 64  # connections handled at once; more are closed at once
NEUTRAL = "/"  # where the server stands between requests


class EventStream(io.TextIOBase):
    """A text stream (the request's stderr) whose lines travel to the client as events."""

    def __init__(self, send) -> None:  # type: ignore[no-untyped-def]
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


class Job:
    """A request the main thread decodes; `done` once it has."""

    def __init__(self, channel: Channel, request: dict) -> None:
        self.channel, self.request = channel, request
        self.done = threading.Event()


class Server:
    def __init__(self, address: Address, idle_s: float) -> None:
        self.address, self.idle_s = address, idle_s
        self.stamp = addresses.code_stamp()
        self.sessions = kept_sessions.Sessions(KEPT_SESSIONS)
        self.process_inputs: reads.Record = {}  # what a running process cannot load again (the kernel library)
        self.listener: socket.socket | None = None
        self.running = True
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.decoder = threading.Lock()  # held by the request the main thread decodes, or is about to
        self.preloading = threading.Event()  # requests wait for the preload instead of WAIT_S
        self.clients = threading.BoundedSemaphore(MOST_CLIENTS)
        self.last_active = time.monotonic()

    # ------------------------------------------------------------------ lifetime
    def listen(self) -> str | None:
        """Bind the socket (replacing a stale one: the lock says none is live). None once
        listening; "live" when another server holds the lock; else why it cannot listen."""
        self.lock = open(self.address.lock, "a+b")
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "live"
        problem = addresses.socket_problem(self.address.socket)
        if problem is not None:
            return problem
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.address.socket)  # a stale socket (socket_problem: nothing else)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_mask = os.umask(0o177)
        try:
            listener.bind(str(self.address.socket))
        except OSError as exc:
            listener.close()
            return f"cannot listen on {self.address.socket} ({exc.strerror or exc})"
        finally:
            os.umask(old_mask)
        listener.listen(16)
        self.listener, self.inode = listener, os.stat(self.address.socket).st_ino
        return None

    def close(self) -> None:
        self._unlink_socket()
        if self.listener is not None:
            self.listener.close()

    def _unlink_socket(self) -> None:
        """Remove the socket if it is still ours: no new client connects to a server on its way out."""
        with contextlib.suppress(OSError):
            if os.stat(self.address.socket).st_ino == self.inode:
                os.unlink(self.address.socket)

    def shut_down(self, why: str) -> None:
        """Stop taking requests, stop the decoding at its next chunk, and make sure the process
        ends soon even where a build cannot be interrupted."""
        if not self.running:
            return
        log(why)
        self.running = False
        self._unlink_socket()
        self.jobs.put(None)  # wakes the main thread
        timer = threading.Timer(STOP_GRACE_S, os._exit, args=(0,))
        timer.daemon = True
        timer.start()

    def run(self) -> None:
        """The main thread: decode the requests handed over, until stopped or idle."""
        self.last_active = time.monotonic()  # idle from here, not from before the preload
        while self.running:
            try:
                job = self.jobs.get(timeout=POLL_S)
            except queue.Empty:
                if self._idle():
                    log("idle: exiting")
                    return
                continue
            if job is not None:
                self.decode(job)

    def _idle(self) -> bool:
        return time.monotonic() - self.last_active > self.idle_s and not self.decoder.locked()

    def start_accepting(self) -> None:
        threading.Thread(target=self._accept, name="accept", daemon=True).start()

    def _accept(self) -> None:
        """Take connections for as long as the server runs, each on a thread of its own."""
        self.listener.settimeout(POLL_S)  # type: ignore[union-attr]
        while self.running:
            try:
                connection, _ = self.listener.accept()  # type: ignore[union-attr]
            except socket.timeout:
                continue
            except OSError:
                if not self.running:
                    return
                time.sleep(POLL_S)  # out of descriptors: wait for some to close
                continue
            self.last_active = time.monotonic()
            if not self.clients.acquire(blocking=False):
                connection.close()
                continue
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    # ------------------------------------------------------------------ one connection
    def _serve(self, connection: socket.socket) -> None:
        """One connection's thread: its request read, answered or handed to the main thread."""
        try:
            with connection:
                channel = Channel(connection)
                if channel.uid != os.getuid():
                    return
                self.answer(channel, channel.read_request())
        except BadRequest as exc:
            log(f"bad request: {exc}")
        except ClientGone as exc:
            if "without a request" not in str(exc):
                log(f"client went away: {exc}")
        except Exception:  # noqa: BLE001 - a thread's failure is logged, never printed to a client
            log("".join(traceback.format_exc()))
        finally:
            self.clients.release()

    def answer(self, channel: Channel, request: dict) -> None:
        if request.get("stop"):
            channel.send({"stopped": os.getpid()})
            self.shut_down(f"stopped by pid {channel.pid}")
            return
        if "protocol" not in request:
            raise BadRequest("no protocol")
        if (request.get("protocol"), request.get("stamp"), request.get("key")) != \
                (addresses.PROTOCOL, self.stamp, self.address.key):
            channel.send({"stale": True})
            self.shut_down("a client of other code or environment: making way for its own server")
            return
        changed = reads.changed(self.process_inputs)
        if changed:
            channel.send({"stale": True})
            self.shut_down(f"{changed[0]} changed since it was loaded: making way for a fresh server")
            return
        self.hand_over(channel, request)

    def hand_over(self, channel: Channel, request: dict) -> None:
        """Queue the request for the main thread and wait until it is decoded; `busy` where the
        decoding is not free within WAIT_S (the preload is waited for)."""
        if not self._take_decoder():
            channel.send({"busy": True})
            return
        try:
            job = Job(channel, request)
            self.jobs.put(job)
            while not job.done.wait(POLL_S):
                if not self.running and self.jobs.empty():
                    return
        finally:
            self.decoder.release()

    def _take_decoder(self) -> bool:
        deadline = time.monotonic() + WAIT_S
        while not self.decoder.acquire(timeout=POLL_S / 5):
            if not self.running or (time.monotonic() > deadline and not self.preloading.is_set()):
                return False
        return True

    # ------------------------------------------------------------------ decoding (main thread)
    def decode(self, job: Job) -> None:
        """Decode one request; whatever happens, the server goes on (and back to NEUTRAL)."""
        try:
            self.generate(job.request, job.channel)
        except ClientGone as exc:
            log(f"pid {job.channel.pid}: client {exc}: stopped decoding for it")
        except Exception:  # noqa: BLE001 - logged; the client was told or is gone
            log("".join(traceback.format_exc()))
        finally:
            with contextlib.suppress(OSError):
                os.chdir(NEUTRAL)
            self.last_active = time.monotonic()
            job.done.set()

    def generate(self, request: dict, channel: Channel) -> None:
        from ..errors import UserError

        cwd = request.get("cwd")
        try:
            if not isinstance(cwd, str):  # (an integer would be taken for a file descriptor)
                raise TypeError("not a path")
            os.chdir(cwd)
        except (OSError, TypeError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            channel.send({"error": f"the warm server cannot enter the working directory {cwd!r} ({reason}); "
                                   "run again from a folder it can enter, or set MARS_SERVER=off", "code": 2})
            return
        stream = EventStream(channel.send)
        with contextlib.redirect_stderr(stream):
            try:
                self.decode_request(request, channel, str(cwd))
            except UserError as exc:
                stream.flush()
                channel.send({"error": str(exc), "code": 2})
            except Exception as exc:  # the client shows one line (or decodes itself); the traceback goes to the log
                log("".join(traceback.format_exception(exc)))
                stream.flush()
                channel.send({"error": f"the warm server failed: {type(exc).__name__}: {exc} (log: {self.address.log})",
                              "code": 1})
            finally:
                stream.flush()

    def decode_request(self, request: dict, channel: Channel, cwd: str) -> None:
        """Find (or build) the session, then send the generation events as they come."""
        from .. import generation
        from ..errors import UserError
        from ..options import DecodingOptions
        from ..startup import Startup
        from ..tuning.clock import TALLY

        try:
            options = DecodingOptions.of(**_object(request.get("options")))
            text = request["text"]
            if not isinstance(text, str):
                raise TypeError("the prompt is not text")
        except (TypeError, KeyError) as exc:
            raise UserError(f"the warm server could not read the request ({exc})") from None
        options.validate()
        kept_sessions.as_a_fresh_process()
        startup = Startup(request.get("import_s"), TALLY.seconds, measure_import=False)
        key = kept_sessions.session_key(cwd, options)
        kept, changed = self.sessions.find(key)
        if changed:
            log(f"{changed[0]} changed{f' (and {len(changed) - 1} more)' if len(changed) > 1 else ''}: "
                "building the session again")
        channel.send({"hello": os.getpid(), "reused": kept is not None})
        log(f"pid {channel.pid}: decoding ({'session reused' if kept is not None else 'building a session'})")
        with reads.recording() as seen:
            if kept is None:
                kept = kept_sessions.build(options, startup)
                self.sessions.keep(key, kept)
                self.note_process_inputs()
                session = kept.session
            else:
                session = kept_sessions.for_call(kept, options)
                startup.built(TALLY.seconds)
            stream = request.get("stream", True)
            between = self.still_wanted(channel)
            for event in generation.events(session, text, startup, bool(stream), between):  # type: ignore[arg-type]
                sys.stderr.flush()
                channel.send(event)
        for name, identity in seen.items():  # what decoding read too (a cost curve on the first round)
            kept.inputs.setdefault(name, identity)

    def still_wanted(self, channel: Channel):  # type: ignore[no-untyped-def]
        """Between decoded chunks: stop for a client that is gone, or a server that is stopping."""
        def check() -> None:
            if not self.running:
                raise ClientGone("was dropped: the server is stopping")
            channel.check()

        return check

    def note_process_inputs(self) -> None:
        """The kernel library, once loaded: a changed one makes this server stale (it cannot load it again)."""
        library = kept_sessions.kernel_library()
        if library is not None:
            self.process_inputs.setdefault(os.path.abspath(library), reads.identity(library))

    def preload(self, flat_options: dict) -> None:
        """Build the session the starting command used, before the first request asks for it
        (in the starting command's folder); requests wait for it."""
        from ..options import DecodingOptions
        from ..startup import Startup

        self.preloading.set()
        try:
            with self.decoder:
                options = DecodingOptions.of(**flat_options)
                kept = kept_sessions.build(options, Startup(measure_import=False))
                self.sessions.keep(kept_sessions.session_key(os.getcwd(), options), kept)
                self.note_process_inputs()
        except Exception as exc:  # noqa: BLE001 - the request will meet (and show) the same problem
            log(f"preload failed: {exc}")
        finally:
            self.preloading.clear()  # after the decoder is free: a waiting request takes it


def _object(value: object) -> dict:
    if not isinstance(value, dict):
        raise TypeError("the options are not a JSON object")
    return value


def log(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{os.getpid()}] {text}", file=sys.__stderr__, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mars_cli.warm.server")
    parser.add_argument("--key", required=True, help="the environment key the client computed")
    parser.add_argument("--preload", help="a session's options (flat names, JSON) to build first")
    args = parser.parse_args(argv)
    place = addresses.folder()
    if not addresses.private_folder(place, create=True):
        log(f"{place} {addresses.folder_problem(place) or 'cannot be made'}: not serving")
        return 2
    server = Server(Address(place, args.key), addresses.idle_timeout_s())
    problem = server.listen()
    if problem == "live":
        return 0  # another server is live
    if problem is not None:
        log(f"not serving: {problem}")
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log(f"listening on {server.address.socket} (idle timeout {server.idle_s:g} s)")
    try:
        server.start_accepting()
        if args.preload:
            server.preload(json.loads(args.preload))
        os.chdir(NEUTRAL)  # not the starting command's folder (a mount kept busy)
        server.run()
    except KeyboardInterrupt:
        log("interrupted: exiting")
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
