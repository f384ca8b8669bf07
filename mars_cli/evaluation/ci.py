"""What CI systems read of a `mars eval` run: JUnit XML, GitHub Actions' step summary and error
annotations, and a stored baseline for the next run to compare with."""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import TextIO

from ..errors import require
from ..paths import create_directory, write_atomic


def check_destination(folder: Path) -> None:
    """Refuse a --save-baseline DIR that cannot be written, before the run (not after it)."""
    require(not folder.is_file(), f"--save-baseline {folder} is a file; name a directory")
    parent = folder if folder.exists() else folder.parent
    require(parent.is_dir(), f"--save-baseline {folder}: {parent} does not exist (create it first)")
    require(os.access(parent, os.W_OK), f"--save-baseline {folder}: cannot write to {parent}")


def save_baseline(results: dict, folder: Path) -> Path:
    """`--save-baseline DIR`: the run's results document (per-sample figures and cost curve
    included) as DIR/results.json, which `--baseline DIR` reads (check_destination vetted DIR
    before the run)."""
    create_directory(folder)
    path = folder / "results.json"
    write_atomic(path, json.dumps(results, indent=1, ensure_ascii=False))
    return path


def junit_document(results: dict) -> ElementTree.ElementTree:
    """One <testcase> per scope x method x gate, in one <testsuite>; a failed gate's <failure>
    carries its figure and interval."""
    outcomes = (results.get("gates") or {}).get("outcomes", [])
    failed = sum(not o["passed"] for o in outcomes)
    suite = ElementTree.Element("testsuite", name="mars eval", tests=str(len(outcomes)), failures=str(failed),
                                errors="0", skipped="0")
    for outcome in outcomes:
        case = ElementTree.SubElement(suite, "testcase", classname=f"mars eval.{outcome['scope']}",
                                      name=f"{outcome['method']} {outcome['gate']}")
        if outcome["passed"]:
            ElementTree.SubElement(case, "system-out").text = outcome["message"]
        else:
            failure = ElementTree.SubElement(case, "failure", message=outcome["message"], type=outcome["gate"])
            failure.text = outcome["message"]
    root = ElementTree.Element("testsuites", name="mars eval", tests=str(len(outcomes)), failures=str(failed))
    root.append(suite)
    return ElementTree.ElementTree(root)


def write_junit(results: dict, path: Path) -> None:
    document = junit_document(results)
    ElementTree.indent(document)
    text = ElementTree.tostring(document.getroot(), encoding="unicode", xml_declaration=True)
    write_atomic(path, text + "\n")


def report_to_github(results: dict, markdown: str, environ: dict | None = None, stream: TextIO | None = None) -> list[str]:
    """Under GitHub Actions (GITHUB_ACTIONS=true): the report appended to $GITHUB_STEP_SUMMARY,
    and one `::error` workflow command per failed gate on `stream` (stdout; stderr where stdout
    carries --json, which the runner reads as well). Returns those lines; elsewhere does nothing."""
    environ = os.environ if environ is None else environ
    if environ.get("GITHUB_ACTIONS") != "true":
        return []
    summary = environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as handle:
            handle.write(markdown + "\n")
    lines = [f"::error title=mars eval gate {o['gate']}::{_escaped(o['message'])}"
             for o in (results.get("gates") or {}).get("outcomes", []) if not o["passed"]]
    for line in lines:
        print(line, file=stream or sys.stdout, flush=True)
    return lines


def _escaped(text: str) -> str:
    """A workflow command's data: %, CR and LF escaped as GitHub documents."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
