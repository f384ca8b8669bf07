"""`mars eval`'s CI outputs (issue 67, items 5 and 6): every output path checked before the first
sample, none replacing another file or a device, and JUnit that is always well-formed XML."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from mars_cli.cli import main
from mars_cli.errors import UserError
from mars_cli.evaluation import ci

ROOT = Path(__file__).resolve().parents[2]
RUN = ["eval", "--methods", "vanilla", "-n", "2", "--limit", "1", "--device", "cpu", "--dtype", "float32",
       "--packed-weights", "off"]


@pytest.fixture()
def no_model(monkeypatch):
    """The refusals must come before any model loads: loading fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the outputs were checked")

    monkeypatch.setattr("mars_cli.models.load_model", refuse)


def refused(capsys, args: list[str], expected: str) -> str:
    code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and expected in lines[0], err
    return lines[0]


def suite_file(path: Path, records: int = 1) -> Path:
    path.write_text("".join(json.dumps({"id": f"s{i}", "prompt": f"Say {i}."}) + "\n" for i in range(records)))
    return path


# ----------------------------------------------------------------------------- item 5: checked before the run
def test_junit_on_a_device_node_is_refused_and_the_device_stays(capsys, tmp_path, tiny_dir, no_model):
    """As root, `--junit /dev/null` became a regular file after the run (the rename replaced the
    device); a device node made here stands in for it."""
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        pytest.skip("cannot make a device node here (not root)")
    suite = suite_file(tmp_path / "s.jsonl")
    refused(capsys, [*RUN, "--suite", str(suite), "--target", str(tiny_dir), "--junit", str(device)],
            f"--junit {device} is a device, not a regular file")
    assert stat.S_ISCHR(device.stat().st_mode)


def test_junit_cannot_replace_the_runs_own_files_or_the_baseline(capsys, tmp_path, tiny_dir, no_model):
    suite = suite_file(tmp_path / "s.jsonl")
    base = [*RUN, "--suite", str(suite), "--target", str(tiny_dir)]
    out = tmp_path / "run"
    refused(capsys, [*base, "--out", str(out), "--junit", str(out / "results.json")], "is --out's results.json")
    refused(capsys, [*base, "--out", str(out), "--junit", str(out / "samples.jsonl")], "is --out's samples.jsonl")
    saved = tmp_path / "saved"
    refused(capsys, [*base, "--save-baseline", str(saved), "--junit", str(saved / "results.json")],
            "is --save-baseline's results.json")
    refused(capsys, [*base, "--junit", str(tmp_path)], "is a directory, not a regular file")
    refused(capsys, [*base, "--junit", str(tmp_path / "no" / "such.xml")], "does not exist (create it first)")
    assert not out.exists() and not saved.exists()


def test_the_baseline_being_read_is_not_replaced_by_junit(capsys, tmp_path, tiny_dir, no_model):
    from tests.evaluation.test_baseline_schema import valid_document

    suite = suite_file(tmp_path / "s.jsonl")
    stored = tmp_path / "baseline" / "results.json"
    stored.parent.mkdir()
    stored.write_text(json.dumps(valid_document()))
    before = stored.read_bytes()
    refused(capsys, [*RUN, "--suite", str(suite), "--target", str(tiny_dir), "--baseline", str(stored.parent),
                     "--junit", str(stored)], "is the --baseline being read")
    assert stored.read_bytes() == before


def test_no_output_replaces_a_suite_or_the_baseline_or_is_a_directory(capsys, tmp_path, tiny_dir, no_model):
    """A directory where results.json belongs was a traceback after the run; --junit naming the
    suite file replaced it; an --out holding the baseline replaced the baseline with this run."""
    from tests.evaluation.test_baseline_schema import valid_document

    suite = suite_file(tmp_path / "s.jsonl")
    base = [*RUN, "--suite", str(suite), "--target", str(tiny_dir)]
    refused(capsys, [*base, "--junit", str(suite)], f"--junit {suite} is the suite file {suite}")
    out = tmp_path / "run"
    (out / "results.json").mkdir(parents=True)
    refused(capsys, [*base, "--out", str(out)], "results.json there is not a regular file (a directory)")
    saved = tmp_path / "saved"
    (saved / "results.json").mkdir(parents=True)
    refused(capsys, [*base, "--save-baseline", str(saved)], "results.json there is not a regular file")
    stored = tmp_path / "old-run"
    stored.mkdir()
    (stored / "results.json").write_text(json.dumps(valid_document()))
    refused(capsys, [*base, "--out", str(stored), "--baseline", str(stored)],
            "its results.json would replace the --baseline being read")
    assert json.loads((stored / "results.json").read_text()) == valid_document()


@pytest.mark.parametrize("kind, expected", [
    ("fifo", "is a FIFO, not a regular file"),
    ("directory", "is a directory, not a regular file"),
    ("missing folder", "does not exist (create it first)"),
])
def test_a_step_summary_that_cannot_be_appended_to_is_refused_before_the_run(capsys, tmp_path, tiny_dir, no_model,
                                                                            monkeypatch, kind, expected):
    summary = {"fifo": tmp_path / "summary.fifo", "directory": tmp_path,
               "missing folder": tmp_path / "no" / "summary.md"}[kind]
    if kind == "fifo":
        os.mkfifo(summary)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    suite = suite_file(tmp_path / "s.jsonl")
    line = refused(capsys, [*RUN, "--suite", str(suite), "--target", str(tiny_dir)], expected)
    assert line.startswith("mars: error: $GITHUB_STEP_SUMMARY")


def test_a_fifo_step_summary_on_a_real_process_is_one_line_not_a_hang(tmp_path, tiny_dir):
    """The run wrote its results, then blocked for ever opening the FIFO (no reader)."""
    summary = tmp_path / "summary.fifo"
    os.mkfifo(summary)
    suite = suite_file(tmp_path / "s.jsonl")
    env = {**os.environ, "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary), "MARS_SERVER": "off",
           "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-m", "mars_cli.cli", *RUN, "--suite", str(suite), "--target",
                               str(tiny_dir), "--out", str(tmp_path / "run")], env=env, capture_output=True,
                              text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("mars eval hung on a FIFO as $GITHUB_STEP_SUMMARY")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "is a FIFO, not a regular file" in done.stderr
    assert not (tmp_path / "run").exists()  # refused before the run: nothing half-done


def test_appending_the_summary_never_blocks_and_never_writes_a_non_file(tmp_path):
    """Checked before the run, and again when written: a FIFO put there meanwhile is one line."""
    summary = tmp_path / "summary.fifo"
    os.mkfifo(summary)
    results = {"gates": {"outcomes": []}}
    found: list[BaseException] = []

    def report() -> None:
        try:
            ci.report_to_github(results, "# report", {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            found.append(exc)

    worker = threading.Thread(target=report, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():
        with open(summary, "rb"):  # unblock the writer, then fail
            pass
        pytest.fail("appending to a FIFO step summary blocked")
    assert len(found) == 1 and isinstance(found[0], UserError) and "GITHUB_STEP_SUMMARY" in str(found[0])


def test_check_outputs_accepts_ordinary_files(tmp_path):
    existing = tmp_path / "junit.xml"
    existing.write_text("old")
    ci.check_outputs(existing, tmp_path / "run", None, tmp_path / "saved",
                     {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")})
    ci.check_outputs(tmp_path / "run" / "junit.xml", tmp_path / "run", None, None, {})  # beside --out's files: fine
    with pytest.raises(UserError, match=r"\$GITHUB_STEP_SUMMARY .* is --junit's file"):
        ci.check_outputs(existing, None, None, None, {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(existing)})


# ----------------------------------------------------------------------------- item 6: JUnit is XML
def test_junit_escapes_every_name_and_message(tmp_path):
    nasty = "suite\x1b[31m\x00\x07\udcff\x85\ufffe"
    results = {"gates": {"outcomes": [
        {"scope": nasty, "method": f"mars{nasty}", "gate": f"regression:{nasty}", "passed": False,
         "message": f"{nasty}: tau <fell> & \"so\""},
        {"scope": "all", "method": "strict", "gate": "min-speedup", "passed": True, "message": nasty}]}}
    path = tmp_path / "junit.xml"
    ci.write_junit(results, path)
    root = ElementTree.parse(path).getroot()  # well-formed
    cases = root.findall("./testsuite/testcase")
    assert cases[0].get("classname") == "mars eval.suite\\x1b[31m\\x00\\x07\\udcff\\x85\\ufffe"
    assert cases[0].find("failure").get("message").endswith('tau <fell> & "so"')
    assert cases[1].find("system-out").text == "suite\\x1b[31m\\x00\\x07\\udcff\\x85\\ufffe"


def test_suite_files_named_with_control_characters_and_bad_bytes_give_xml(capsys, tmp_path, tiny_dir):
    """Suite names reach the JUnit through the regression gates (one per suite): a name with ESC
    gave JUnit that did not parse (exit 0); one with a byte that is not UTF-8 was a traceback after
    the model ran, leaving an empty samples.jsonl."""
    folder = tmp_path / "suites"
    folder.mkdir()
    control = suite_file(folder / "ctl\x1b[1mname.jsonl")
    latin = Path(os.fsdecode(bytes(folder) + b"/caf\xe9.jsonl"))
    suite_file(latin)
    args = ["eval", "--suite", f"{control},{latin}", "--methods", "vanilla,strict", "-n", "3", "--device", "cpu",
            "--dtype", "float32", "--packed-weights", "off", "--num-draft", "2", "--draft-topk", "1",
            "--target", str(tiny_dir)]
    out, saved = tmp_path / "run", tmp_path / "baseline"
    assert main([*args, "--out", str(out), "--save-baseline", str(saved)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text(encoding="utf-8").splitlines()]
    assert {r["suite"] for r in records} == {"ctl\\x1b[1mname", "caf\\xe9"}
    junit = tmp_path / "junit.xml"
    code = main([*args, "--baseline", str(saved), "--max-regression", "tau=0", "--junit", str(junit)])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    root = ElementTree.parse(junit).getroot()  # well-formed
    scopes = {case.get("classname") for case in root.findall("./testsuite/testcase")}
    assert scopes == {"mars eval.ctl\\x1b[1mname", "mars eval.caf\\xe9", "mars eval.all"}
    assert "\x1b" not in junit.read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- item 11: --suite ''
@pytest.mark.parametrize("text", ["", " , ,"])
def test_an_empty_suite_list_is_one_line(capsys, tiny_dir, no_model, text):
    refused(capsys, ["eval", "--suite", text, "--target", str(tiny_dir), "--device", "cpu"], "names no suite")


def test_an_empty_suite_list_on_a_real_process(tiny_dir):
    env = {**os.environ, "MARS_SERVER": "off", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "mars_cli.cli", "eval", "--suite", "", "--target", str(tiny_dir),
                           "--device", "cpu"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == ["mars: error: --suite '' names no suite: use one of chat, code, "
                                                "math, summarize, translate, multiturn, humaneval, all, a .jsonl "
                                                "file or hf:NAME[:CONFIG][:SPLIT]"]
