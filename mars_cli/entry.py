"""The `mars` console script. A Ctrl-C while the command line itself is still importing (typer,
rich: the first few tenths of a second) exits 130 with one line, as one later does (cli.main)."""

from __future__ import annotations

import signal
import sys


def _interrupted(signum: int, frame: object) -> None:
    sys.stderr.write("interrupted\n")
    raise SystemExit(130)


def main() -> int:
    previous = signal.signal(signal.SIGINT, _interrupted)
    from .cli import main as run

    signal.signal(signal.SIGINT, previous)  # from here on cli.main turns a Ctrl-C into exit 130
    return run()
