"""The error matrix for `mars generate`: bad input through the real entry point gives exit code 2
and one line on stderr naming the problem, with no traceback; Ctrl-C and a closed pipe end quietly."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from mars_cli.cli import main

from .errors_helpers import MODEL, one_line_error


def test_prompt_longer_than_context_window(capsys, tiny_dir):
    one_line_error(capsys, ["generate", "x" * 400, "--target", str(tiny_dir), *MODEL], "context window")


def test_non_utf8_stdin(monkeypatch, capsys, tiny_dir):
    class Stdin(io.TextIOWrapper):
        def isatty(self) -> bool:
            return False

    monkeypatch.setattr(sys, "stdin", Stdin(io.BytesIO(b"caf\xe9 \xff")))
    one_line_error(capsys, ["generate", "-", "--target", str(tiny_dir), *MODEL], "not valid UTF-8")


# ----------------------------------------------------------------------------- interrupts
def test_ctrl_c_during_generate_keeps_the_text_and_exits_130(capsys, monkeypatch, tiny_dir):
    """Ctrl-C arrives as KeyboardInterrupt in the middle of decoding (after some rounds)."""
    from mars_cli.session import Session

    real_stream = Session.stream

    def interrupted_stream(self, *args, **kwargs):
        for index, chunk in enumerate(real_stream(self, *args, **kwargs)):
            if index == 5:
                raise KeyboardInterrupt
            yield chunk

    monkeypatch.setattr(Session, "stream", interrupted_stream)
    code = main(["generate", "abc abc", "--target", str(tiny_dir), "--raw", "-n", "50", *MODEL])
    captured = capsys.readouterr()
    assert code == 130
    assert len(captured.out.strip()) >= 3  # the five rounds already decoded were printed
    assert "interrupted" in captured.err and "Traceback" not in captured.err


def test_closed_output_pipe_exits_quietly_with_141(tiny_dir):
    """`mars generate ... | head -c 5`: the reader is gone; no traceback, no exit 1 (kept for gates)."""
    import os
    import subprocess

    script = Path(sys.executable).with_name("mars")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has already gone: the first write fails, deterministically
    done = subprocess.run([str(script), "generate", "hello there", "--target", str(tiny_dir), "--raw", "-n", "20",
                           *MODEL, "--dtype", "float32", "--packed-weights", "off", "--draft", "none"],  # nothing to measure
                          stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""
