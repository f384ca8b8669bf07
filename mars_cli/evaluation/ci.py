"""What CI systems read of a `mars eval` run: JUnit XML, GitHub Actions' step summary and error
annotations, and a stored baseline for the next run to compare with."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Collection, Mapping, Sequence, TextIO

from ..errors import UserError, require
from ..paths import check_can_create, create_directory, write_atomic

# what `mars eval --out DIR` writes into DIR (runner.prepare_out_dir, report.write_all)
OUT_FILES = ("run.json", "samples.jsonl", "results.json", "report.md", "speed_quality.png", "sweep.png",
             "acceptance.png")
SUMMARY_VARIABLE = "GITHUB_STEP_SUMMARY"


def check_destination(folder: Path) -> None:
    """Refuse a --save-baseline DIR that cannot be written, before the run (not after it)."""
    require(not folder.is_file(), f"--save-baseline {folder} is a file; name a directory")
    parent = folder if folder.exists() else folder.parent
    require(parent.is_dir(), f"--save-baseline {folder}: {parent} does not exist (create it first)")
    require(os.access(parent, os.W_OK), f"--save-baseline {folder}: cannot write to {parent}")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_output_file(flag: str, path: Path, taken: Mapping[str, str] | None = None, append: bool = False,
                      created: Collection[str] = ()) -> None:
    """Refuse, in one line, an output file a run could not write or would clobber: something other
    than a regular file at `path` (a device, a FIFO, a directory), a folder that is missing or
    cannot be written, or a path another output or input of the run already names (`taken`:
    real path -> what it is). `append`: the file is appended to (the step summary), not replaced.
    `created`: real paths of folders the run creates itself (--out, --save-baseline: vetted apart)."""
    found = _stat(path)
    require(found is None or stat.S_ISREG(found.st_mode),
            f"{flag} {path} is {_kind(found.st_mode) if found else ''}, not a regular file: name a file to "
            f"{'append to' if append else 'write'}")
    real = os.path.realpath(path)
    require(real not in (taken or {}), f"{flag} {path} is {(taken or {}).get(real)}: name another file")
    folder = path.parent
    if not folder.exists() and os.path.realpath(folder) in created:
        return  # inside --out or --save-baseline, made by the run (their own checks vet the parent)
    require(folder.is_dir(), f"{flag} {path}: {folder} " + ("is not a directory" if folder.exists()
                                                           else "does not exist (create it first)"))
    if append and found is not None:
        require(os.access(path, os.W_OK), f"{flag} {path}: cannot write to it")
    else:
        check_can_create(folder, path)


def check_outputs(junit: Path | None, out_dir: Path | None, baseline_file: Path | None,
                  save_baseline_dir: Path | None, environ: Mapping[str, str] | None = None,
                  inputs: Sequence[Path] = ()) -> None:
    """Every file a run writes, checked before the first sample (the run is long; a path that
    cannot be written was a traceback after it, and one file could replace another): --junit and,
    under GitHub Actions, $GITHUB_STEP_SUMMARY must each be a regular file or nothing, in a folder
    that can be written, and none of --out's files, the --baseline being read, --save-baseline's
    results.json, an input (`inputs`: the suite files) or each other; --out's and --save-baseline's
    own files must be regular files or nothing, and none of them the baseline or an input."""
    reads = {os.path.realpath(path): f"the suite file {path}" for path in inputs}
    if baseline_file is not None:
        reads[os.path.realpath(baseline_file)] = "the --baseline being read"
    owned = {}  # what --out and --save-baseline write, each checked here
    if out_dir is not None:
        owned.update({out_dir / name: (f"--out {out_dir}:", f"--out's {name}") for name in OUT_FILES})
    if save_baseline_dir is not None:
        owned[save_baseline_dir / "results.json"] = (f"--save-baseline {save_baseline_dir}:",
                                                     "--save-baseline's results.json")
    created = {os.path.realpath(folder) for folder in (out_dir, save_baseline_dir) if folder is not None}
    for path, (flag, _) in owned.items():
        found = None if path.name == "samples.jsonl" else _stat(path)  # the sample log: prepare_out_dir's
        require(found is None or stat.S_ISREG(found.st_mode),
                f"{flag} {path.name} there is not a regular file ({_kind(found.st_mode) if found else ''}): remove "
                "it or name another folder")
        what = reads.get(os.path.realpath(path))
        require(what is None, f"{flag} its {path.name} would replace {what}: name another folder")
    taken = {**reads, **{os.path.realpath(path): what for path, (_, what) in owned.items()}}
    if junit is not None:
        check_output_file("--junit", junit, taken, created=created)
        taken[os.path.realpath(junit)] = "--junit's file"
    summary = github_summary(environ)
    if summary is not None:
        check_output_file(f"${SUMMARY_VARIABLE}", summary, taken, append=True, created=created)


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):  # a missing folder: its own check says so
        return None
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror or exc}") from None


def github_summary(environ: Mapping[str, str] | None = None) -> Path | None:
    """$GITHUB_STEP_SUMMARY where a run appends its report (under GitHub Actions only)."""
    environ = os.environ if environ is None else environ
    if environ.get("GITHUB_ACTIONS") != "true" or not environ.get(SUMMARY_VARIABLE):
        return None
    return Path(environ[SUMMARY_VARIABLE])


def save_baseline(results: dict, folder: Path) -> Path:
    """`--save-baseline DIR`: the run's results document (per-sample figures and cost curve
    included) as DIR/results.json, which `--baseline DIR` reads (check_destination vetted DIR
    before the run)."""
    from .baseline import schema_problem

    problem = schema_problem(results)  # what --baseline reads back: the same schema
    require(problem is None, f"cannot save a baseline in {folder}: {problem} (the results are written)")
    try:
        text = json.dumps(results, indent=1, ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise UserError(f"cannot save a baseline in {folder}: a figure is not a finite number (the results are "
                        "written)") from None
    create_directory(folder)
    path = folder / "results.json"
    write_atomic(path, text)
    return path


# XML 1.0 allows tab, LF, CR and these ranges: anything else (control characters, a lone surrogate
# from a file name that is not UTF-8) is written as its escape, so the document always parses
_NOT_XML = re.compile("[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(value: object) -> str:
    """`value` as text an XML document can hold: characters XML 1.0 forbids (and C1 controls)
    become visible escapes (\\x1b, \\udcff); ElementTree escapes the markup characters."""
    return _NOT_XML.sub(lambda m: (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                   else f"\\u{ord(m.group()):04x}"), str(value))


def junit_document(results: dict) -> ElementTree.ElementTree:
    """One <testcase> per scope x method x gate, in one <testsuite>; a failed gate's <failure>
    carries its figure and interval. Every name and message goes through `xml_text`."""
    outcomes = (results.get("gates") or {}).get("outcomes", [])
    failed = sum(not o["passed"] for o in outcomes)
    suite = ElementTree.Element("testsuite", name="mars eval", tests=str(len(outcomes)), failures=str(failed),
                                errors="0", skipped="0")
    for outcome in outcomes:
        message, gate = xml_text(outcome["message"]), xml_text(outcome["gate"])
        case = ElementTree.SubElement(suite, "testcase", classname=xml_text(f"mars eval.{outcome['scope']}"),
                                      name=xml_text(f"{outcome['method']} {outcome['gate']}"))
        if outcome["passed"]:
            ElementTree.SubElement(case, "system-out").text = message
        else:
            failure = ElementTree.SubElement(case, "failure", message=message, type=gate)
            failure.text = message
    root = ElementTree.Element("testsuites", name="mars eval", tests=str(len(outcomes)), failures=str(failed))
    root.append(suite)
    return ElementTree.ElementTree(root)


def write_junit(results: dict, path: Path) -> None:
    """The JUnit document, written atomically to `path` (check_outputs vetted it before the run;
    it is checked again here, and a failure is one line: the results are written already)."""
    document = junit_document(results)
    ElementTree.indent(document)
    text = ElementTree.tostring(document.getroot(), encoding="unicode", xml_declaration=True)
    check_output_file("--junit", path)
    try:
        write_atomic(path, text + "\n")
    except OSError as exc:
        raise UserError(f"cannot write --junit {path}: {exc.strerror or exc} (the results are written)") from None


def report_to_github(results: dict, markdown: str, environ: dict | None = None, stream: TextIO | None = None) -> list[str]:
    """Under GitHub Actions (GITHUB_ACTIONS=true): the report appended to $GITHUB_STEP_SUMMARY,
    and one `::error` workflow command per failed gate on `stream` (stdout; stderr where stdout
    carries --json, which the runner reads as well). Returns those lines; elsewhere does nothing."""
    environ = os.environ if environ is None else environ
    if environ.get("GITHUB_ACTIONS") != "true":
        return []
    summary = github_summary(environ)
    if summary is not None:
        _append(summary, markdown + "\n")
    lines = [f"::error title=mars eval gate {o['gate']}::{_escaped(o['message'])}"
             for o in (results.get("gates") or {}).get("outcomes", []) if not o["passed"]]
    for line in lines:
        print(line, file=stream or sys.stdout, flush=True)
    return lines


def _append(path: Path, text: str) -> None:
    """Append to the step summary without blocking (a FIFO with no reader is refused, not waited
    on) and only to a regular file (check_outputs vetted it before the run)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    where = f"${SUMMARY_VARIABLE} {path}"
    try:
        handle = os.open(path, flags, 0o666)
    except OSError as exc:
        raise UserError(f"cannot append to {where}: {exc.strerror or exc} (the results are written)") from None
    try:
        mode = os.fstat(handle).st_mode
        require(stat.S_ISREG(mode), f"{where} is {_kind(mode)}, not a regular file (the results are written)")
        os.set_blocking(handle, True)
        data = text.encode("utf-8", "backslashreplace")
        while data:
            data = data[os.write(handle, data):]
    except OSError as exc:
        raise UserError(f"cannot append to {where}: {exc.strerror or exc} (the results are written)") from None
    finally:
        os.close(handle)


def _escaped(text: str) -> str:
    """A workflow command's data: %, CR and LF escaped as GitHub documents."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
