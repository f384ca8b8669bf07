"""The error matrix for `mars eval`: bad input, suites, resume files and the code sandbox through the
real entry point give exit code 2 and one line on stderr naming the problem, with no traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mars_cli.cli import main
from mars_cli.errors import UserError

from .errors_helpers import MODEL, one_line_error


def test_eval_errors(capsys, files, tiny_dir):
    base = ["eval", "--target", str(tiny_dir), *MODEL]
    one_line_error(capsys, [*base, "--suite", "nope"], "unknown suite")
    one_line_error(capsys, [*base, "--suite", str(files["bad_jsonl"])], "line 3")
    one_line_error(capsys, [*base, "--methods", "fast"], "unknown method")
    one_line_error(capsys, [*base, "--sweep", "0.9:0.8:0.1"], "--sweep")
    one_line_error(capsys, [*base, "--out", str(files["a_file"])], "is a file")
    one_line_error(capsys, [*base, "--out", str(files["a_file"] / "sub")], "cannot create")
    one_line_error(capsys, [*base, "--resume"], "--resume needs --out")
    one_line_error(capsys, [*base, "--repeats", "0"], "--repeats")


def test_suite_content_cannot_choose_where_files_are_written(capsys, tmp_path, tiny_dir):
    suite = tmp_path / "evil.jsonl"
    suite.write_text('{"id": "../../escaped", "prompt": "hi"}\n{"id": "/tmp/escaped-abs", "prompt": "yo"}\n')
    out = tmp_path / "deep" / "run"
    out.parent.mkdir()  # only the last level of --out is created
    before = set(tmp_path.rglob("*"))
    code = main(["eval", "--suite", str(suite), "--methods", "vanilla", "-n", "3", "--target", str(tiny_dir),
                 "--out", str(out), *MODEL])
    assert code == 0
    created = set(tmp_path.rglob("*")) - before
    assert created and all(out in path.parents or path in (out, out.parent) for path in created)
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/escaped-abs").exists()


def _write_suite(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_weak_sandbox_runs_code_where_only_root_is_mapped(tmp_path):
    """`unshare --user --map-root-user`: root there cannot become nobody (EINVAL); the program
    used to fail before it ran, and scored 0. Now it runs, strictly isolated as a user's is."""
    import os
    import shutil
    import subprocess

    if shutil.which("unshare") is None or subprocess.run(["unshare", "--user", "--map-root-user", "true"],
                                                         capture_output=True).returncode != 0:
        pytest.skip("user namespaces are not available here")
    script = ("from mars_cli.evaluation import execution, jail\n"
              "source = 'import os\\nassert 1 + 1 == 2\\nassert os.geteuid() != 0\\n'\n"
              "print(jail._nobody_mapped(), execution.run_program(source, strict=True),"
              " execution.run_program(source, strict=False))\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-c", script], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("False Outcome(passed=True, reason='passed') "
                                   "Outcome(passed=True, reason='passed')"), done.stdout


def test_a_refused_chown_to_nobody_is_one_clear_line(monkeypatch, capsys, tmp_path):
    """The launcher's refusal was `OSError: [Errno 22] Invalid argument` (a traceback's last line)."""
    import errno
    import os

    from mars_cli.evaluation import jail

    def chown(*args):
        raise OSError(errno.EINVAL, "Invalid argument")

    config = {"strict": True, "folder": str(tmp_path)}
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(config)))  # the launcher reads its settings there
    monkeypatch.setattr(os, "dup2", lambda *args: None)  # (it then points fd 0 at /dev/null: not pytest's)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "chown", chown)
    monkeypatch.setattr(jail, "_nobody_mapped", lambda: True)
    assert jail.main() == jail.SETUP_FAILED
    err = capsys.readouterr().err
    assert err == "mars-sandbox: cannot give the program's directory to the unprivileged user nobody (Invalid argument)\n"


def test_weak_sandbox_that_cannot_run_a_program_refuses_before_loading(monkeypatch):
    from mars_cli.evaluation import execution

    def broken(*args, **kwargs):
        raise execution.SandboxUnavailable("cannot give the program's directory to the unprivileged user nobody "
                                           "(Invalid argument)")

    monkeypatch.setattr(execution, "isolation_problem", lambda: "unshare: Operation not permitted (EPERM)")
    monkeypatch.setattr(execution, "run_program", broken)
    execution._weak_problem.cache_clear()
    try:
        with pytest.raises(UserError, match="even with weaker isolation .cannot give the program's directory"):
            execution.sandbox_mode(True)
    finally:
        execution._weak_problem.cache_clear()


def test_duplicate_sample_ids_are_refused(capsys, tmp_path, tiny_dir, no_model):
    suite = _write_suite(tmp_path / "twice.jsonl", [{"id": "a", "prompt": "hi"}, {"id": "a", "prompt": "yo"}])
    one_line_error(capsys, ["eval", "--suite", str(suite), "--target", str(tiny_dir), *MODEL],
                   "the id 'a' is used by more than one sample")
    one_line_error(capsys, ["eval", "--suite", "math,math", "--target", str(tiny_dir), *MODEL],
                   "two suites are named 'math'")


@pytest.mark.parametrize("record, expected", [
    ({"prompt": "hi", "reference": 42}, "'reference' must be a non-empty string, got int 42"),
    ({"prompt": "hi", "answer": {"value": 3}}, "'answer' must be a number"),
    ({"prompt": "hi", "answer": "three"}, "'answer' must be a number"),
    ({"prompt": "hi", "test": ["assert 1"]}, "'test' must be a non-empty string"),
    ({"prompt": "hi", "id": ["x"]}, "'id' must be a non-empty string or an integer"),
])
def test_suite_fields_of_the_wrong_type_are_refused_before_loading(capsys, tmp_path, tiny_dir, no_model, record,
                                                                  expected):
    suite = _write_suite(tmp_path / "typed.jsonl", [{"prompt": "fine", "answer": 1}, record])
    one_line_error(capsys, ["eval", "--suite", str(suite), "--target", str(tiny_dir), *MODEL],
                   f"line 2: {expected}")


@pytest.mark.parametrize("name, make, expected", [
    ("run.json", lambda p: p.write_bytes(b"\xff"), "run file"),
    ("run.json", lambda p: __import__("os").mkfifo(p), "is not a regular file"),
    ("samples.jsonl", lambda p: __import__("os").mkfifo(p), "sample log"),
])
def test_eval_resume_files_that_cannot_be_read(capsys, tmp_path, tiny_dir, no_model, name, make, expected):
    out = tmp_path / "run"
    out.mkdir()
    if name != "run.json":
        (out / "run.json").write_text("{}")
    make(out / name)
    one_line_error(capsys, ["eval", "--target", str(tiny_dir), "--out", str(out), "--resume", *MODEL], expected)
