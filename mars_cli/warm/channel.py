"""One client's connection as the warm server sees it. No client can hold the server: its request
is read within a deadline, every event is sent within a timeout (a client suspended with Ctrl-Z
stops reading), and between decoded chunks the server checks that the client is still there (a
`--json` client, sent nothing until the end, may have been interrupted long before).
"""

from __future__ import annotations

import json
import select
import socket
import time

from .client import MAX_LINE, peer

REQUEST_S = 5.0  # the whole request line arrives within this, or the connection is dropped
SEND_S = 10.0  # a client that reads nothing for this long is dropped, and its decoding stopped
HUNG_UP = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)


class ClientGone(BaseException):
    """The client hung up, stopped reading, or sent no request in time: whatever runs for it stops.
    A BaseException, so that no library's `except Exception` on the way out keeps decoding."""


class BadRequest(Exception):
    """A request line that is not a JSON object."""


class Channel:
    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        credentials = peer(connection)
        self.pid, self.uid = credentials if credentials is not None else (None, None)

    def read_request(self, seconds: float = REQUEST_S) -> dict:
        """The request line, read within `seconds` in all (a silent or half-sent request is
        dropped, never waited on); BadRequest where it is not one JSON object."""
        deadline = time.monotonic() + seconds
        received = bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientGone(f"sent no whole request within {seconds:g} s")
            self.connection.settimeout(left)
            try:
                chunk = self.connection.recv(1 << 16)
            except socket.timeout:
                raise ClientGone(f"sent no whole request within {seconds:g} s") from None
            except OSError as exc:
                raise ClientGone(f"went away before its request ({exc.strerror or exc})") from None
            if not chunk and not received:  # a probe: connected, then closed
                raise ClientGone("closed without a request")
            received += chunk
            if not chunk or b"\n" in chunk or len(received) > MAX_LINE:
                break
        return parse_request(bytes(received).split(b"\n", 1)[0])

    def send(self, event: dict) -> None:
        """One event, sent within SEND_S: ClientGone where the client is gone or stopped reading."""
        data = json.dumps(event, ensure_ascii=False).encode("utf-8") + b"\n"
        self.connection.settimeout(SEND_S)
        try:
            self.connection.sendall(data)
        except socket.timeout:
            raise ClientGone(f"read nothing for {SEND_S:g} s (suspended?)") from None
        except OSError as exc:
            raise ClientGone(f"went away ({exc.strerror or type(exc).__name__})") from None

    def check(self) -> None:
        """ClientGone where the client has hung up (it sends nothing after its request, so
        anything readable is the end of the connection)."""
        poller = select.poll()
        poller.register(self.connection, select.POLLIN | HUNG_UP)
        for _, flags in poller.poll(0):
            if flags & HUNG_UP:
                raise ClientGone("went away (hung up)")
            if flags & select.POLLIN and self._at_end():
                raise ClientGone("went away (hung up)")

    def _at_end(self) -> bool:
        try:
            return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True


def parse_request(line: bytes) -> dict:
    """A request line as a dict; BadRequest for anything else (a list, a number, not JSON)."""
    if len(line) > MAX_LINE:
        raise BadRequest(f"a request line over {MAX_LINE} bytes")
    try:
        request = json.loads(line or b"{}")
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(request, dict):
        raise BadRequest(f"a JSON {type(request).__name__}, not an object")
    return request
