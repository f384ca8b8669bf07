"""Every line mars writes on stderr that is not an error, with one prefix: `mars: note: ...` for
what a user should know, `mars: warning: ...` for what may be unsafe or slow. Errors are the CLI's
(`mars: error: ...`, cli.py); the sandboxed child process has its own prefix (evaluation/jail.py)."""

from __future__ import annotations

import sys

_SHOWN: set[str] = set()


def note(text: str, *, once: bool = False) -> None:
    """`mars: note: TEXT` on stderr. `once`: at most once per process (eval and calibration
    build a session per method, and each would say the same)."""
    _say("note", text, once)


def warn(text: str, *, once: bool = False) -> None:
    """`mars: warning: TEXT` on stderr."""
    _say("warning", text, once)


def _say(kind: str, text: str, once: bool) -> None:
    from .terminal import shown

    line = f"mars: {kind}: {shown(text)}"
    if once:
        if line in _SHOWN:
            return
        _SHOWN.add(line)
    print(line, file=sys.stderr, flush=True)
