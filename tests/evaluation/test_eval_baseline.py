"""`mars eval` for CI jobs: bootstrap intervals, the modelled speedup, baselines and their
refusals, regression gates, JUnit XML and GitHub Actions output (tiny model; no timing decides)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest

from mars_cli.cli import main
from mars_cli.errors import UserError
from mars_cli.evaluation import baseline as baselines
from mars_cli.evaluation import ci
from mars_cli.evaluation.bootstrap import change, interval, ratio
from mars_cli.evaluation.figures import METRICS, curve_from, forwards_per_token, within
from mars_cli.evaluation.results import check_gates, failures_of

# a fixed draft shape, float32, greedy: the token-derived figures repeat exactly
CI_ARGS = ["eval", "--suite", "math,translate", "--limit", "3", "-n", "12", "--device", "cpu", "--dtype", "float32",
           "--packed-weights", "off", "--methods", "vanilla,strict,mars", "--num-draft", "4", "--draft-topk", "1"]


def record(sample: str, method: str, tokens: int, rounds: int, widths: dict | None = None, wall: float = 1.0,
           suite: str = "math", score: float | None = 1.0, logprob: float = -10.0, agreement: float | None = None):
    return {"suite": suite, "sample_id": sample, "method": method, "new_tokens": tokens, "rounds": rounds,
            "widths": widths or {"1": rounds}, "wall_s": wall, "walls": [wall], "task_score": score,
            "sum_logprob": logprob, "agreement_rouge_l": agreement, "agreement_tokens": agreement}


# ----------------------------------------------------------------------------- bootstrap
def test_an_unchanged_paired_figure_has_a_zero_width_interval():
    columns = np.array([[10, 5, 10, 5], [12, 4, 12, 4], [7, 7, 7, 7]], dtype=float)
    found = interval(columns, change(ratio(0, 1), ratio(2, 3), relative=True))
    assert (found.estimate, found.low, found.high, found.samples) == (0.0, 0.0, 0.0, 3)


def test_interval_brackets_the_ratio_of_sums_and_is_reproducible():
    rng = np.random.default_rng(1)
    columns = np.column_stack([rng.integers(20, 40, 30), rng.integers(8, 20, 30)]).astype(float)
    first, second = interval(columns, ratio(0, 1)), interval(columns, ratio(0, 1))
    assert first == second  # a fixed seed: the same figures give the same interval anywhere
    assert first.estimate == pytest.approx(columns[:, 0].sum() / columns[:, 1].sum())
    assert first.low < first.estimate < first.high


def test_a_uniform_drop_is_inside_its_interval_and_a_wider_level_is_wider():
    tokens = np.full(20, 48.0)
    rounds = np.linspace(18, 26, 20)
    columns = np.column_stack([tokens, rounds * 1.1, tokens, rounds])  # every sample 10% more rounds
    narrow = interval(columns, change(ratio(0, 1), ratio(2, 3), True), level=0.95)
    assert narrow.estimate == pytest.approx(1 / 1.1 - 1)
    assert narrow.low == pytest.approx(narrow.high) == pytest.approx(1 / 1.1 - 1)
    noisy = columns.copy()
    noisy[::2, 1] *= 1.08
    wide, wider = (interval(noisy, change(ratio(0, 1), ratio(2, 3), True), level=level) for level in (0.9, 0.999))
    assert wider.low <= wide.low < wide.high <= wider.high


# ----------------------------------------------------------------------------- figures
def test_modelled_speedup_prices_every_forward_by_its_width():
    curve = curve_from({"1": 10.0, "5": 20.0})
    chain = record("a", "strict", tokens=12, rounds=4, widths={"5": 3, "1": 1})
    plain = record("a", "vanilla", tokens=12, rounds=12)
    found = within(METRICS["modelled"], [chain], {("math", "a"): plain}, curve)
    assert found.estimate == pytest.approx(12 * 10.0 / (3 * 20.0 + 1 * 10.0))
    assert within(METRICS["modelled"], [plain], {}, curve).estimate == pytest.approx(1.0)
    assert within(METRICS["modelled"], [chain], {}, None) is None  # no curve, no modelled speedup
    assert forwards_per_token([chain]) == (pytest.approx(4 / 12), pytest.approx(16 / 4))


# ----------------------------------------------------------------------------- flags and identity
@pytest.mark.parametrize("text", ["tau", "tau=-1", "speed=0.1", "tau=nan", "tau=x"])
def test_a_bad_regression_limit_is_one_line(text):
    with pytest.raises(UserError, match="--max-regression"):
        baselines.parse_regressions(text)


def test_regression_limits_and_ignored_keys_parse():
    assert baselines.parse_regressions("tau=0.05, task=0.02") == {"tau": 0.05, "task": 0.02}
    assert baselines.parse_ignore("head,dtype") == {"head", "dtype"}
    with pytest.raises(UserError, match="--baseline-ignore colour"):
        baselines.parse_ignore("head,colour")


def identity(**changes) -> dict:
    base = {"target": "t" * 16, "head": "h" * 16, "dtype": "float32", "max_new_tokens": 64, "temperature": 0.0,
            "engine": "transformers", "suites": {"chat": "c" * 16, "code": "d" * 16}}
    return {**base, **changes}


@pytest.mark.parametrize("changes, message", [
    ({"target": "u" * 16}, "target differs"),
    ({"head": "g" * 16}, "head differs"),
    ({"dtype": "bfloat16"}, "dtype differs"),
    ({"max_new_tokens": 32}, "max_new_tokens differs"),
    ({"suites": {"chat": "c" * 16}}, "suites code differ"),
    ({"suites": {"chat": "c" * 16, "code": "e" * 16}}, "suites code differ"),
])
def test_a_baseline_of_another_run_is_refused_unless_ignored(changes, message, tmp_path):
    with pytest.raises(UserError, match=message):
        baselines.check_comparable(identity(**changes), {"identity": identity()}, set(), tmp_path)
    key = next(iter(changes))
    baselines.check_comparable(identity(**changes), {"identity": identity()}, {key}, tmp_path)


def test_a_missing_sample_in_the_baseline_is_refused(tmp_path):
    stored = [record("a", "strict", 12, 4), record("b", "strict", 12, 4)]
    baselines.check_samples([record("a", "strict", 12, 4)], stored, tmp_path)  # a subset is fine
    with pytest.raises(UserError, match="no strict record of math/c"):
        baselines.check_samples([record("c", "strict", 12, 4)], stored, tmp_path)


def write(path: Path, document) -> Path:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


@pytest.mark.parametrize("document, message", [
    ('{"identity": {"target": ', "not valid JSON"),
    ({"samples": []}, "no identity"),
    ({"identity": {}, "samples": [], "complete": False}, "interrupted run"),
    ({"identity": {}, "samples": [{"suite": "math"}], "complete": True}, "malformed"),
])
def test_a_broken_baseline_file_is_one_line(document, message, tmp_path):
    with pytest.raises(UserError, match=message):
        baselines.load(write(tmp_path / "results.json", document))
    with pytest.raises(UserError, match="no such run"):
        baselines.load(tmp_path / "elsewhere")


# ----------------------------------------------------------------------------- gates on constructed runs
def constructed_run(rounds_scale: float = 1.0, samples: int = 24) -> list[dict]:
    rng = np.random.default_rng(7)
    records = []
    for index in range(samples):
        rounds = int(rng.integers(14, 30))
        records.append(record(f"s{index}", "vanilla", 48, 48))
        slower = max(1, round(rounds * rounds_scale))
        records.append(record(f"s{index}", "strict", 48, slower, widths={"5": slower}))
    return records


def test_a_planted_tau_drop_fails_its_gate_and_an_unchanged_run_passes():
    stored = {"samples": constructed_run(), "cost_curve": {"ms_by_width": {"1": 10.0, "5": 14.0}}}
    same = baselines.regression_gates(constructed_run(), stored, ["math"], {"tau": 0.02, "modelled": 0.02})
    assert same and all(o["passed"] for o in same)
    assert all("+0.00%" in o["message"] for o in same)
    dropped = baselines.regression_gates(constructed_run(1.1), stored, ["math"], {"tau": 0.02, "modelled": 0.02})
    assert {o["gate"] for o in dropped if not o["passed"]} == {"regression:tau", "regression:modelled"}
    assert "wholly below -2%" in failures_of(dropped)[0]
    lenient = baselines.regression_gates(constructed_run(1.1), stored, ["math"], {"tau": 0.2})
    assert all(o["passed"] for o in lenient)  # a 9% drop is within a 20% tolerance


def test_the_speed_gate_fails_only_when_the_whole_interval_is_below_the_limit():
    rows = [{"method": "vanilla", "speedup": 1.0, "task_metric": None, "agreement_rouge_l": 1.0},
            {"method": "mars", "speedup": 1.1, "task_metric": None, "agreement_rouge_l": 1.0,
             "intervals": {"speedup": [0.95, 1.25]}}]
    assert failures_of(check_gates(rows, 1.2, None)) == []  # 1.2 lies inside the interval: not shown slower
    rows[1]["intervals"]["speedup"] = [0.95, 1.15]
    assert failures_of(check_gates(rows, 1.2, None)) == ["mars: speedup 1.100x [0.950, 1.150]: the whole "
                                                         "interval is below 1.2x"]


# ----------------------------------------------------------------------------- end to end, tiny model
def run_json(capsys, args) -> tuple[int, dict, str]:
    capsys.readouterr()
    code = main([*args, "--json"])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if captured.out.strip() else {}), captured.err


def test_five_runs_against_their_own_baseline_pass_with_zero_change(capsys, tiny_dir, tmp_path):
    base = tmp_path / "baseline"
    code, first, _ = run_json(capsys, [*CI_ARGS, "--target", str(tiny_dir), "--save-baseline", str(base)])
    assert code == 0 and first["determinism"] == {"deterministic": True, "because": []}
    assert json.loads((base / "results.json").read_text())["samples"] == first["samples"]
    gates = "tau=0,modelled=0,task=0,agreement=0,logprob=0"
    for _ in range(5):
        code, again, err = run_json(capsys, [*CI_ARGS, "--target", str(tiny_dir), "--baseline", str(base),
                                             "--max-regression", gates])
        assert code == 0 and "gates passed" in err
        deterministic = [c for c in again["baseline"]["comparisons"] if c["deterministic"]]
        assert deterministic and all(c["change"] == c["low"] == c["high"] == 0.0 for c in deterministic)
        assert again["cost_curve"]["source"].startswith("the baseline's")


def test_a_relaxed_threshold_is_caught_against_a_strict_baseline(capsys, tiny_dir, tmp_path):
    base = tmp_path / "baseline"
    args = ["eval", "--suite", "translate", "--limit", "10", "-n", "16", "--device", "cpu", "--dtype", "float32",
            "--packed-weights", "off", "--methods", "vanilla,mars", "--num-draft", "4", "--draft-topk", "1", "--target", str(tiny_dir)]
    assert run_json(capsys, [*args, "--threshold", "1.0", "--save-baseline", str(base)])[0] == 0
    junit = tmp_path / "gates.xml"
    code, relaxed, err = run_json(capsys, [*args, "--threshold", "0.5", "--baseline", str(base),
                                           "--max-regression", "agreement=0.005,tau=0.05", "--junit", str(junit)])
    assert code == 1 and "agreement with vanilla" in err
    failed = [o for o in relaxed["gates"]["outcomes"] if not o["passed"]]
    assert [(o["gate"], o["method"]) for o in failed] == [("regression:agreement", "mars")]  # tau rose: passed
    root = ElementTree.parse(junit).getroot()
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(relaxed["gates"]["outcomes"])  # one per scope x method x gate
    failures = [case for case in cases if case.find("failure") is not None]
    assert len(failures) == len(failed) == int(root.get("failures"))
    assert "agreement" in failures[0].find("failure").get("message")


@pytest.mark.parametrize("extra, message", [
    (["--dtype", "bfloat16"], "dtype differs"),
    (["--limit", "2"], "suites math, translate differ"),
    (["-n", "8"], "max_new_tokens differs"),
])
def test_cli_refuses_a_baseline_of_another_run(capsys, tiny_dir, tmp_path, extra, message):
    base = tmp_path / "baseline"
    assert run_json(capsys, [*CI_ARGS, "--target", str(tiny_dir), "--save-baseline", str(base)])[0] == 0
    code, _, err = run_json(capsys, [*CI_ARGS, "--target", str(tiny_dir), *extra, "--baseline", str(base)])
    # one error line (a CPU without native bfloat16 adds its one-line note about --dtype bfloat16)
    errors = [line for line in err.strip().splitlines() if not line.startswith("mars: note: ")]
    assert code == 2 and message in err and "Traceback" not in err and len(errors) == 1


def test_cli_refuses_another_target_a_truncated_file_and_a_missing_sample(capsys, tiny_dir, tiny_draft_dir, tmp_path):
    base = tmp_path / "baseline"
    assert run_json(capsys, [*CI_ARGS, "--target", str(tiny_dir), "--save-baseline", str(base)])[0] == 0
    code, _, err = run_json(capsys, [*CI_ARGS, "--target", str(tiny_draft_dir), "--baseline", str(base)])
    assert code == 2 and "target differs" in err
    stored = base / "results.json"
    document = json.loads(stored.read_text())
    document["samples"] = [s for s in document["samples"]
                           if not (s["sample_id"] == "math-01" and s["method"] == "strict")]
    write(tmp_path / "missing.json", document)
    code, _, err = run_json(capsys, [*CI_ARGS, "--target", str(tiny_dir), "--baseline", str(tmp_path / "missing.json")])
    assert code == 2 and "no strict record of math/math-01" in err
    write(stored, stored.read_text()[:500])
    code, _, err = run_json(capsys, [*CI_ARGS, "--target", str(tiny_dir), "--baseline", str(base)])
    assert code == 2 and "not valid JSON" in err
    code, _, err = run_json(capsys, [*CI_ARGS, "--target", str(tiny_dir), "--max-regression", "tau=0.05"])
    assert code == 2 and "add --baseline" in err


def test_github_actions_gets_the_report_and_error_lines_only_there(tmp_path, capsys):
    results = {"gates": {"outcomes": [
        {"scope": "all", "method": "mars", "gate": "regression:tau", "passed": False, "message": "tau fell 9%\nbadly"},
        {"scope": "all", "method": "strict", "gate": "regression:tau", "passed": True, "message": "fine"}]}}
    summary = tmp_path / "summary.md"
    assert ci.report_to_github(results, "# report", {"GITHUB_STEP_SUMMARY": str(summary)}) == []
    assert not summary.exists()
    lines = ci.report_to_github(results, "# report", {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert lines == ["::error title=mars eval gate regression:tau::tau fell 9%25%0Abadly"]
    assert capsys.readouterr().out.strip() == lines[0]
    assert summary.read_text() == "# report\n"
    ci.report_to_github(results, "# second", {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert summary.read_text() == "# report\n# second\n"  # appended, as steps share the file


def test_a_statistical_gate_on_too_few_samples_is_not_judged_but_an_exact_one_is():
    stored = {"samples": constructed_run(samples=4), "cost_curve": None}
    slower = constructed_run(1.1, samples=4)
    exact = baselines.regression_gates(slower, stored, ["math"], {"tau": 0.02}, deterministic=True)
    assert [o["passed"] for o in exact] == [False]
    sampled = baselines.regression_gates(slower, stored, ["math"], {"tau": 0.02}, deterministic=False)
    assert [o["passed"] for o in sampled] == [True] and "not judged" in sampled[0]["message"]
    many = baselines.regression_gates(constructed_run(1.1), {"samples": constructed_run()}, ["math"], {"tau": 0.02})
    assert [o["passed"] for o in many] == [False]  # 24 samples: judged, and the drop is clear


def test_sampled_runs_repeat_with_their_seed_and_pass_against_another_seed(capsys, tiny_dir, tmp_path):
    args = [*CI_ARGS[:4], "5", *CI_ARGS[5:], "--target", str(tiny_dir), "--temperature", "0.8"]
    base = tmp_path / "baseline"
    assert run_json(capsys, [*args, "--seed", "1", "--save-baseline", str(base)])[0] == 0
    gates = ["--max-regression", "tau=0,agreement=0,logprob=0"]
    code, same, _ = run_json(capsys, [*args, "--seed", "1", "--baseline", str(base), *gates])
    assert code == 0 and not same["determinism"]["deterministic"] and "sampled" in same["determinism"]["because"][0]
    token_figures = [c for c in same["baseline"]["comparisons"] if c["metric"] != "speedup"]
    assert token_figures and all(c["change"] == 0.0 for c in token_figures)  # a seed repeats exactly
    code, other, err = run_json(capsys, [*args, "--seed", "2", "--baseline", str(base), *gates])
    assert code == 0 and "gates passed" in err
    judged = [o for o in other["gates"]["outcomes"] if "not judged" not in o["message"]]
    assert {o["scope"] for o in judged} == {"all"}  # 10 samples there; 5 a suite is too few to judge
    assert any(c["change"] != 0.0 for c in other["baseline"]["comparisons"])  # another seed: other tokens


@pytest.mark.embedded
def test_a_noisy_head_is_caught_on_the_embedded_model(capsys, smollm2, tmp_path, monkeypatch):
    """The planted regression of bench_ci_gates.py: the shipped head with noise in every weight
    (tau down about 10%), against a baseline of the shipped head, with docs/ci.md's fixed flags."""
    import importlib.util

    tool = Path(__file__).parents[2] / "benchmarks" / "bench_ci_gates.py"
    spec = importlib.util.spec_from_file_location("bench_ci_gates", tool)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    noisy = bench.noisy_head(0.12, tmp_path)
    args = ["eval", "--suite", "chat,code", "--limit", "6", "-n", "32", *bench.FIXED]
    base = tmp_path / "baseline"
    args += ["--methods", "vanilla,strict"]
    assert run_json(capsys, [*args, "--draft", "head", "--save-baseline", str(base)])[0] == 0
    gates = ["--max-regression", "tau=0.02,modelled=0.02", "--baseline", str(base)]
    code, _, err = run_json(capsys, [*args, "--draft", f"head:{noisy}", *gates])
    assert code == 2 and "head differs" in err  # another head's run is refused unless asked for
    code, found, err = run_json(capsys, [*args, "--draft", f"head:{noisy}", *gates, "--baseline-ignore", "head"])
    assert code == 1 and "tau (tokens per round) changed" in err
    failed = {(o["scope"], o["gate"]) for o in found["gates"]["outcomes"] if not o["passed"]}
    assert ("all", "regression:tau") in failed


def test_save_baseline_into_a_missing_folder_is_refused_before_the_run(capsys, tiny_dir, tmp_path):
    code, _, err = run_json(capsys, [*CI_ARGS, "--target", str(tiny_dir), "--save-baseline",
                                     str(tmp_path / "no" / "such")])
    assert code == 2 and "does not exist" in err and "evaluating" not in err
