"""The error matrix for `mars profile`: bad input and traces that cannot be written, through the real
entry point, give exit code 2 and one line on stderr naming the problem, with no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from mars_cli.errors import UserError

from .errors_helpers import MODEL, one_line_error


def test_profile_errors(capsys, files, tiny_dir):
    base = ["profile", "--target", str(tiny_dir), *MODEL]
    one_line_error(capsys, [*base, "--sweep-num-draft", "0:4"], "--sweep-num-draft")
    one_line_error(capsys, [*base, "--bucket", "0"], "--bucket")
    one_line_error(capsys, [*base, "--plot", str(files["a_file"] / "x.png")], "cannot create")


def test_trace_into_proc_is_refused_before_loading(capsys, tiny_dir, no_model):
    one_line_error(capsys, ["profile", "--target", str(tiny_dir), "--trace", "/proc/mars-trace.json", *MODEL],
                   "cannot write")  # root: "/proc does not accept new files"; others: no write permission


def _immutable(path: Path, monkeypatch) -> None:
    """chattr +i where the file system and our rights allow it (root on ext4, not tmpfs); elsewhere
    the system calls an immutable file refuses (a write check, a rename onto it) refuse it so."""
    import errno
    import os
    import shutil
    import subprocess

    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0:
        return
    real_access, real_replace = os.access, os.replace
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == path and mode & os.W_OK
                        else real_access(p, mode, **kw))

    def replace(source, target, *args, **kwargs):
        if Path(target) == path:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


def _mutable(path: Path) -> None:
    """Undo `_immutable`'s chattr, where there was one (pytest then cleans the folder up)."""
    import shutil
    import subprocess

    if shutil.which("chattr"):
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def test_trace_onto_an_immutable_file_is_refused(capsys, tmp_path, tiny_dir, no_model, monkeypatch):
    trace = tmp_path / "trace.json"
    trace.write_text("{}")
    _immutable(trace, monkeypatch)
    try:
        one_line_error(capsys, ["profile", "--target", str(tiny_dir), "--trace", str(trace), *MODEL],
                       f"cannot write {trace}: the file is not writable")
    finally:
        _mutable(trace)


def test_trace_that_cannot_be_written_late_is_one_line_and_leaves_nothing(capsys, monkeypatch, tmp_path, tiny_dir):
    """The profiler reports no failure, and left its 14 MB `.tmp` behind: here it writes only that."""
    import torch.profiler

    def export_nothing(self, path, *args, **kwargs):
        Path(path + ".tmp").write_text("x" * 1000)

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", export_nothing)
    trace = tmp_path / "trace.json"
    trace.write_text("kept")  # an earlier trace is not lost
    one_line_error(capsys, ["profile", "--target", str(tiny_dir), "-n", "4", "--trace", str(trace), *MODEL],
                   f"cannot write the trace {trace}: the profiler wrote nothing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"] and trace.read_text() == "kept"


def test_trace_rename_refused_keeps_the_old_file_and_leaves_nothing(tmp_path, monkeypatch):

    from mars_cli.profiling import export_trace

    trace = tmp_path / "trace.json"
    trace.write_text("kept")
    _immutable(trace, monkeypatch)
    try:
        with pytest.raises(UserError, match="cannot write the trace .*Operation not permitted"):
            export_trace(lambda path: Path(path).write_text("{}"), trace)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"] and trace.read_text() == "kept"
    finally:
        _mutable(trace)
