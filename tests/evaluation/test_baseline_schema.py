"""A baseline is validated as a whole when it is read (issue 67, item 7): a forged or damaged
results.json is one line before any model loads, never a crash after the run nor a silent pass;
a gate that cannot be judged says so and fails unless --allow-unjudged."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mars_cli.cli import main
from mars_cli.errors import UserError
from mars_cli.evaluation import baseline as baselines
from mars_cli.evaluation import ci

ROOT = Path(__file__).resolve().parents[2]


def sample(sample_id: str, method: str, tokens: int = 12, rounds: int = 12, suite: str = "math") -> dict:
    return {"suite": suite, "sample_id": sample_id, "method": method, "new_tokens": tokens, "rounds": rounds,
            "widths": {"1": rounds}, "wall_s": 0.5, "walls": [0.5], "task_score": 1.0, "sum_logprob": -3.0,
            "agreement_tokens": None if method == "vanilla" else 1.0,
            "agreement_rouge_l": None if method == "vanilla" else 1.0}


def valid_document() -> dict:
    return {"command": "mars eval", "suites": ["math"], "complete": True,
            "identity": {"target": "t" * 16, "head": None, "dtype": "float32", "max_new_tokens": 12,
                         "temperature": 0.0, "engine": "transformers", "suites": {"math": "d" * 16}},
            "determinism": {"deterministic": True, "because": []},
            "cost_curve": {"ms_by_width": {"1": 10.0, "5": 14.0}, "source": "this machine's cost curve"},
            "samples": [sample(f"m{i}", method, rounds=12 if method == "vanilla" else 5)
                        for i in range(3) for method in ("vanilla", "strict")]}


def forged(change) -> str:
    document = valid_document()
    change(document)
    return json.dumps(document)


def set_in(path: list, value):
    def change(document):
        target = document
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


FORGED = {  # name -> (the file's text, what the one line says)
    "cost curve width 0": (forged(set_in(["cost_curve", "ms_by_width"], {"0": 5.0, "1": 10.0})),
                           "cost_curve.ms_by_width must map widths 1 to 4096"),
    "cost curve NaN": (forged(set_in(["cost_curve", "ms_by_width", "5"], 0.0)).replace('"5": 0.0', '"5": NaN'),
                       "NaN is not a number a run records"),
    "cost curve negative": (forged(set_in(["cost_curve", "ms_by_width", "5"], -14.0)), "finite milliseconds > 0"),
    "cost curve a list": (forged(set_in(["cost_curve", "ms_by_width"], [10.0, 14.0])), "cost_curve must be null"),
    "4,000-digit new_tokens": (forged(set_in(["samples", 0, "new_tokens"], 0)).replace(
        '"new_tokens": 0', '"new_tokens": ' + "9" * 4000, 1), "an integer of 4000 digits"),
    "new_tokens NaN": (forged(set_in(["samples", 1, "new_tokens"], 0)).replace('"new_tokens": 0', '"new_tokens": NaN', 1),
                       "NaN is not a number"),
    "a float overflowing": (forged(set_in(["samples", 1, "wall_s"], 0.25)).replace('"wall_s": 0.25', '"wall_s": 1e999', 1),
                            "1e999 overflows a float"),
    "identity.suites a number": (forged(set_in(["identity", "suites"], 7)), "identity.suites must be an object"),
    "widths a list": (forged(set_in(["samples", 2, "widths"], [1, 2])), "samples[2].widths must be an object"),
    "an id a list": (forged(set_in(["samples", 0, "sample_id"], ["m0"])), "samples[0].sample_id must be a sample id"),
    "a method a list": (forged(set_in(["samples", 0, "method"], ["vanilla"])), "samples[0].method must be"),
    "no samples": (forged(set_in(["samples"], [])), "samples holds no per-sample records"),
    "complete 'yes'": (forged(set_in(["complete"], "yes")), "is an interrupted run"),
    "tokens in no rounds": (forged(set_in(["samples", 1, "rounds"], 0)), "12 tokens in 0 rounds"),
    "a record twice": (forged(lambda d: d["samples"].append(copy.deepcopy(d["samples"][0]))),
                       "holds vanilla's record of math/m0 twice"),
    "a suite not in the identity": (forged(set_in(["samples", 0, "suite"], "chat")),
                                    "the suite \"chat\", which identity.suites does not list"),
    "agreement above 1": (forged(set_in(["samples", 1, "agreement_rouge_l"], 1.5)), "a number from 0 to 1"),
    "a duplicated key": ('{"complete": true, "complete": true, "identity": {}, "samples": []}',
                         'the key "complete" appears twice'),
    "temperature a string": (forged(set_in(["identity", "temperature"], "0")), "identity.temperature must be"),
    "determinism a list": (forged(set_in(["determinism"], [True])), "determinism must be an object"),
}


@pytest.mark.parametrize("name", list(FORGED))
def test_a_forged_baseline_is_one_line_when_read(tmp_path, name):
    text, message = FORGED[name]
    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(UserError) as found:
        baselines.load(path)
    assert message in str(found.value) and "\n" not in str(found.value)
    assert str(found.value).endswith(("save the baseline again", "finish it with --resume first"))


def test_a_valid_baseline_and_the_committed_one_load():
    path = ROOT / "benchmarks" / "baselines" / "embedded"
    assert baselines.load(path)["complete"] is True
    assert baselines.schema_problem(valid_document()) is None


def test_the_writer_refuses_what_the_reader_would(tmp_path):
    document = valid_document()
    ci.save_baseline(document, tmp_path / "good")
    assert baselines.load(tmp_path / "good") == document
    document["samples"][0]["sum_logprob"] = float("-inf")
    with pytest.raises(UserError, match="cannot save a baseline"):
        ci.save_baseline(document, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("text, message", [
    (",", "names no figure"), ("", "names no figure"), (" , ", "names no figure"),
    ("tau=0.1,tau=0.2", "names tau twice"),
])
def test_a_regression_flag_that_sets_no_gate_is_refused(text, message):
    with pytest.raises(UserError, match=message):
        baselines.parse_regressions(text)


def test_every_method_and_sample_of_the_run_must_be_in_the_baseline(tmp_path):
    stored = valid_document()
    planned = [("math", f"m{i}") for i in range(3)]
    baselines.check_plan(stored, planned, ["vanilla", "strict"], tmp_path)
    with pytest.raises(UserError, match="has no records of the method 'mars'"):
        baselines.check_plan(stored, planned, ["vanilla", "mars"], tmp_path)
    with pytest.raises(UserError, match="no vanilla record of math/m3"):
        baselines.check_plan(stored, [*planned, ("math", "m3")], ["vanilla", "strict"], tmp_path)


# ----------------------------------------------------------------------------- gates that cannot be judged
def test_a_figure_only_one_run_has_fails_its_gate_unless_allowed():
    stored = valid_document()
    for record in stored["samples"]:
        record["task_score"] = None
    current = valid_document()["samples"]
    outcomes = baselines.regression_gates(current, stored, ["math"], {"task": 0.0}, deterministic=True)
    assert outcomes and all(not o["passed"] and o["judged"] is False for o in outcomes)
    assert "task metric cannot be judged: only this run has it: failed (--allow-unjudged passes it)" \
        in outcomes[0]["message"]
    allowed = baselines.regression_gates(current, stored, ["math"], {"task": 0.0}, True, allow_unjudged=True)
    assert allowed and all(o["passed"] and "passed (--allow-unjudged)" in o["message"] for o in allowed)


def test_a_figure_that_is_not_a_number_fails_its_gate():
    """`new_tokens: NaN` once gave "tau changed +nan% ... gates passed", exit 0; the reader refuses
    NaN now, and a figure that still comes out undefined (no tokens in no rounds) is not judged."""
    stored = valid_document()
    for record in stored["samples"]:
        record.update(new_tokens=0, rounds=0)
    outcomes = baselines.regression_gates(valid_document()["samples"], stored, ["math"], {"tau": 0.0}, True)
    assert [o["passed"] for o in outcomes] == [False]
    assert "not a finite number" in outcomes[0]["message"]


def test_a_figure_no_run_has_anywhere_fails_its_gate():
    stored = valid_document()
    stored["cost_curve"] = None
    outcomes = baselines.regression_gates(valid_document()["samples"], stored, ["math"], {"modelled": 0.0}, True)
    assert [o["passed"] for o in outcomes] == [False]
    assert "neither run has it for any suite and method (the baseline stores no cost curve" in outcomes[0]["message"]


# ----------------------------------------------------------------------------- end to end, tiny model
ARGS = ["eval", "--suite", "math", "--limit", "2", "-n", "6", "--device", "cpu", "--dtype", "float32",
        "--packed-weights", "off", "--methods", "vanilla,strict", "--num-draft", "2", "--draft-topk", "1"]


def test_forged_baselines_are_refused_before_the_model_loads_on_a_real_process(capsys, tiny_dir, tmp_path):
    """Each of these crashed after the whole run, or passed it silently (exit 0)."""
    saved = tmp_path / "saved"
    assert main([*ARGS, "--target", str(tiny_dir), "--save-baseline", str(saved)]) == 0
    capsys.readouterr()
    good = json.loads((saved / "results.json").read_text())

    def variant(name: str, change) -> Path:
        document = copy.deepcopy(good)
        change(document)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(document).replace('"new_tokens": 777', '"new_tokens": NaN'))
        return path

    cases = {
        "nan": (variant("nan", lambda d: d["samples"][1].update(new_tokens=777)), "NaN is not a number"),
        "empty": (variant("empty", lambda d: d.update(samples=[])), "holds no per-sample records"),
        "renamed": (variant("renamed", lambda d: [r.update(method="strict2") for r in d["samples"]
                                                 if r["method"] == "strict"]),
                    "has no records of the method 'strict'"),
        "width 0": (variant("width0", lambda d: d["cost_curve"]["ms_by_width"].update({"0": 1.0})),
                    "cost_curve.ms_by_width must map widths 1 to 4096"),
        "suites": (variant("suites", lambda d: d["identity"].update(suites=3)), "identity.suites must be an object"),
    }
    env = {**os.environ, "MARS_SERVER": "off", "PYTHONPATH": str(ROOT)}
    for name, (path, message) in cases.items():
        done = subprocess.run([sys.executable, "-m", "mars_cli.cli", *ARGS, "--target", str(tiny_dir),
                               "--baseline", str(path), "--max-regression", "tau=0", "--out", str(tmp_path / name)],
                              env=env, capture_output=True, text=True, timeout=300)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and message in lines[0], (name, done.stderr)
        assert not (tmp_path / name / "samples.jsonl").exists(), name  # refused before the first sample


def test_a_gate_only_one_run_can_judge_fails_the_run(capsys, tiny_dir, tmp_path):
    """A baseline without task scores against a run with them: the task gate was left out (exit 0)."""
    saved = tmp_path / "saved"
    assert main([*ARGS, "--target", str(tiny_dir), "--save-baseline", str(saved)]) == 0
    document = json.loads((saved / "results.json").read_text())
    for record in document["samples"]:
        record["task_score"] = None
    (saved / "results.json").write_text(json.dumps(document))
    capsys.readouterr()
    code = main([*ARGS, "--target", str(tiny_dir), "--baseline", str(saved), "--max-regression", "task=0,tau=0"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "math/vanilla: task metric cannot be judged: only this run has it" in err
