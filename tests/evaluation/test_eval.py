"""`mars eval`: suites, metrics on hand-made outputs, gates, resume, artefacts, code execution."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from mars_cli.cli import main
from mars_cli.errors import UserError
from mars_cli.evaluation import execution
from mars_cli.evaluation.metrics import (
    chrf,
    common_prefix,
    exact_number,
    extract_code,
    final_number,
    rouge_l,
    token_agreement,
)
from mars_cli.evaluation.methods import parse_methods, parse_sweep
from mars_cli.evaluation.results import check_gates, failures_of
from mars_cli.evaluation.suites import BUILTIN, load_suite


# ----------------------------------------------------------------------------- suites
@pytest.mark.parametrize("name", list(BUILTIN))
def test_builtin_suites_load_with_references(name):
    suite = load_suite(name)
    assert len(suite.samples) >= 24
    assert len({s.id for s in suite.samples}) == len(suite.samples)
    if suite.metric == "exact_number":
        assert all("answer" in s.reference for s in suite.samples)
    if suite.metric in ("rouge_l", "chrf"):
        assert all(s.reference["reference"].strip() for s in suite.samples)
    if suite.metric == "tests":
        assert all({"test", "entry_point"} <= s.reference.keys() for s in suite.samples)


def test_the_multiturn_suite_is_held_out_and_not_in_all():
    """Two turns a sample, eight categories of three (MT-bench's layout, our own prompts); no
    turn is a head-training or calibration prompt; `--suite all` keeps meaning the five single-turn
    suites its recorded results were made with."""
    from mars_cli.evaluation.suites import load_suites

    suite = load_suite("multiturn")
    assert suite.metric is None and all(len(sample.turns) == 2 for sample in suite.samples)
    data = Path(__file__).resolve().parents[2] / "mars_cli" / "data"
    lines = [json.loads(line) for line in (data / "suites" / "multiturn.jsonl").read_text().splitlines()]
    assert sorted(Counter(line["category"] for line in lines).values()) == [3] * 8
    trained = {json.loads(line)["prompt"].strip().lower()
               for name in ("head_prompts.jsonl", "head_prompts_large.jsonl", "calibration_prompts.jsonl")
               for line in (data / name).read_text().splitlines() if line.strip()}
    assert not {turn.strip().lower() for sample in suite.samples for turn in sample.turns} & trained
    names, _ = load_suites("all", 1, allow_code_execution=False)
    assert names == ["chat", "code", "math", "summarize", "translate"]


def test_humaneval_suite_loads_from_the_package():
    suite = load_suite("humaneval", limit=3)
    assert suite.metric == "pass@1" and len(suite.samples) == 3
    assert suite.samples[0].raw and "def " in suite.samples[0].turns[0]


def test_jsonl_suite_with_turns_and_bad_line(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "a", "prompt": "hi"}\n{"turns": ["one", "two"]}\n')
    suite = load_suite(str(path))
    assert [s.turns for s in suite.samples] == [["hi"], ["one", "two"]]
    path.write_text('{"prompt": "hi"}\n{"prompt": \n')
    with pytest.raises(UserError, match="line 2"):
        load_suite(str(path))
    path.write_text('{"prompt": ""}\n')
    with pytest.raises(UserError, match="line 1"):
        load_suite(str(path))


def test_unknown_suite_and_offline_dataset_are_clear_errors(monkeypatch):
    with pytest.raises(UserError, match="unknown suite"):
        load_suite("nope")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(UserError, match="cannot load dataset"):
        load_suite("hf:no-such-owner/no-such-dataset")


# ----------------------------------------------------------------------------- metrics
def test_metrics_on_hand_made_outputs():
    assert final_number("so 3 + 4 = 7. The answer is 1,250.") == 1250
    assert exact_number("The total is 42 dollars", 42) == 1.0 and exact_number("no idea", 42) == 0.0
    assert token_agreement([1, 2, 3], [1, 2, 4]) == pytest.approx(2 / 3)
    assert token_agreement([1, 2], [1, 2, 3, 4]) == 0.5
    assert common_prefix([1, 2, 9, 4], [1, 2, 3, 4]) == 2
    assert rouge_l([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert rouge_l("a b c d".split(), "a x c y".split()) == pytest.approx(0.5)
    assert chrf("Le chat dort.", "Le chat dort.") == pytest.approx(1.0)
    assert 0 < chrf("Le chat dort", "Le chien dort") < 1
    assert chrf("xyz", "abc") == 0.0
    assert extract_code("Here:\n```python\ndef f():\n    return 1\n```\nDone") == "def f():\n    return 1\n"


def test_sweep_and_methods_parse():
    assert parse_sweep("0.80:0.90:0.05") == [0.8, 0.85, 0.9]
    methods = parse_methods("strict,mars", [0.85])
    assert [m.name for m in methods] == ["vanilla", "strict", "mars", "mars@0.85"]
    with pytest.raises(UserError):
        parse_methods("fast", [])
    drafters = parse_methods("strict:ngram,mars:head:/tmp/h.safetensors,strict", [])
    assert [m.changes for m in drafters] == [
        {"draft": "none", "verify": "strict"}, {"verify": "strict", "draft": "ngram"},
        {"verify": "mars", "draft": "head:/tmp/h.safetensors"}, {"verify": "strict"}]
    with pytest.raises(UserError, match="vanilla"):
        parse_methods("vanilla:ngram", [])
    with pytest.raises(UserError):
        parse_sweep("0.9:0.8:0.01")


def rows(speedup: float, task: float, agreement: float) -> list[dict]:
    return [
        {"method": "vanilla", "speedup": 1.0, "task_metric": 0.5, "agreement_rouge_l": 1.0},
        {"method": "mars", "speedup": speedup, "task_metric": task, "agreement_rouge_l": agreement},
    ]


def test_gates_pass_and_fail_on_constructed_results():
    assert failures_of(check_gates(rows(1.3, 0.5, 0.99), 1.2, 0.02)) == []
    assert failures_of(check_gates(rows(1.1, 0.5, 0.99), 1.2, 0.02)) == [
        "mars: speedup 1.100x [1.100, 1.100]: the whole interval is below 1.2x"]
    outcomes = check_gates(rows(1.3, 0.4, 0.9), 1.2, 0.05)
    assert [(o["gate"], o["passed"]) for o in outcomes] == [("min-speedup", True), ("max-quality-drop", False)]
    assert "task metric drops by 0.100" in failures_of(outcomes)[0]
    assert "ROUGE-L" in failures_of(check_gates(rows(1.3, 0.5, 0.9), 1.2, 0.05))[0]
    assert check_gates(rows(0.1, 0.0, 0.0), None, None) == []


# ----------------------------------------------------------------------------- execution
def test_generated_code_runs_sandboxed():
    assert execution.check_function("def add(a, b):\n    return a + b", "assert add(2, 3) == 5").passed
    assert not execution.check_function("def add(a, b):\n    return a - b", "assert add(2, 3) == 5").passed
    assert execution.run_program("while True:\n    pass\n", timeout=1).reason == "timeout"
    big = execution.run_program("x = bytearray(4 * 1024 ** 3)\n", timeout=10)
    assert not big.passed and "MemoryError" in big.reason


def test_code_suites_without_the_flag_run_unscored_with_one_note(capsys, tiny_dir):
    """The built-in code suite and humaneval behave alike without --allow-code-execution: they run,
    unscored, with one note (humaneval's prompts do not fit the tiny model, so it is loaded only)."""
    from mars_cli.evaluation.suites import load_suites

    _, suites = load_suites("humaneval,code,math", 1, False)
    notes = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(notes) == 1 and "humaneval, code are scored by running generated code" in notes[0]
    assert [s.name for s in suites] == ["humaneval", "code", "math"]
    code = main(["eval", "--suite", "code", "--limit", "1", "-n", "3", "--methods", "vanilla", "--target",
                 str(tiny_dir), "--device", "cpu", "--json"])
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if "--allow-code-execution" in line]
    assert code == 0 and len(notes) == 1 and "task metric is not reported" in notes[0]
    assert json.loads(captured.out)["table"]["code"][0]["task_metric"] is None


def test_jsonl_suite_with_tests_is_a_code_suite(capsys, tmp_path, tiny_dir, monkeypatch):
    """`test`/`entry_point` fields make a user code suite, scored only with --allow-code-execution;
    a HumanEval-style `check(candidate)` test is called with the entry point."""
    from mars_cli.evaluation import runner as ev
    from mars_cli.evaluation.suites import Sample

    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "a", "prompt": "write add", "entry_point": "add", '
                    '"test": "def check(f):\\n    assert f(2, 3) == 5"}\n')
    suite = load_suite(str(path))
    assert suite.metric == "tests" and suite.needs_execution
    sample = suite.samples[0]
    good, bad = "```python\ndef add(a, b):\n    return a + b\n```", "def add(a, b):\n    return a - b\n"
    assert ev.task_score(suite, sample, good, True) == 1.0
    assert ev.task_score(suite, sample, bad, True) == 0.0
    assert ev.task_score(suite, sample, good, False) is None
    assert ev.task_score(suite, Sample("b", ["x"], {"test": "assert add(1, 1) == 2"}), good, True) == 1.0


# ----------------------------------------------------------------------------- end to end
EVAL_ARGS = ["eval", "--suite", "math,translate", "--limit", "2", "-n", "12", "--device", "cpu",
             "--methods", "vanilla,strict,mars", "--sweep", "0.85:0.9:0.05"]


def test_tiny_eval_writes_every_artefact(capsys, tmp_path, tiny_dir):
    out = tmp_path / "run"
    code = main([*EVAL_ARGS, "--target", str(tiny_dir), "--out", str(out), "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    for name in ("results.json", "samples.jsonl", "report.md", "run.json", "speed_quality.png", "sweep.png",
                 "acceptance.png"):
        assert (out / name).is_file(), name
    for image in out.glob("*.png"):
        import matplotlib.image

        assert image.read_bytes()[:4] == b"\x89PNG" and matplotlib.image.imread(image).ndim == 3
    results = json.loads((out / "results.json").read_text())
    assert results["table"] == printed["table"]
    overall = {row["method"]: row for row in results["table"]["all"]}
    assert set(overall) == {"vanilla", "strict", "mars", "mars@0.85", "mars@0.9"}
    assert overall["vanilla"]["speedup"] == 1.0 and overall["strict"]["agreement_tokens"] == 1.0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 2 * 5
    assert {"sample_id", "method", "output", "new_tokens", "rounds", "wall_s"} <= samples[0].keys()
    assert "| vanilla |" in (out / "report.md").read_text()


def test_each_methods_warm_up_decodes_a_whole_untimed_first_turn(capsys, tmp_path, tiny_dir, monkeypatch):
    """What a session does on first use (allocation, the costs it measures) stays out of the
    timings: before a method's first timed sample it decodes that sample's first turn in full (a
    4-token warm-up left the first head sample 4-13x slower than the rest)."""
    from mars_cli.session import Session

    calls = []
    real_run = Session.run

    def recording_run(self, prompt, *args, **kwargs):
        result = real_run(self, prompt, *args, **kwargs)
        calls.append((id(self), kwargs.get("settings"), len(result.token_ids)))
        return result

    monkeypatch.setattr(Session, "run", recording_run)
    out = tmp_path / "run"
    assert main([*EVAL_ARGS, "--target", str(tiny_dir), "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    methods = {s["method"] for s in samples}
    # a timed sample passes its settings (stop strings); a warm-up runs the session's own, in full
    warm_ups = [(session, tokens) for session, settings, tokens in calls if settings is None]
    assert len(warm_ups) == len(methods) == len({session for session, _ in warm_ups})
    first_call = {}
    for session, settings, _ in calls:
        first_call.setdefault(session, settings)
    assert all(settings is None for settings in first_call.values())  # before any timed sample
    assert max(tokens for _, tokens in warm_ups) > 4  # past the old 4-token warm-up: -n 12
    assert len(calls) == len(samples) + len(warm_ups)  # and none of them logged as a sample


def test_resume_continues_an_interrupted_run(capsys, tmp_path, tiny_dir, monkeypatch):
    from mars_cli.evaluation import runner as ev

    out = tmp_path / "run"
    real = ev.run_sample
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(ev, "run_sample", flaky)
    code = main([*EVAL_ARGS, "--target", str(tiny_dir), "--out", str(out)])
    assert code == 130
    kept = (out / "samples.jsonl").read_text().splitlines()
    assert len(kept) == 6
    assert json.loads((out / "results.json").read_text())["complete"] is False
    # without --resume the directory is protected
    assert main([*EVAL_ARGS, "--target", str(tiny_dir), "--out", str(out)]) == 2
    # a changed option is refused on resume
    assert main([*EVAL_ARGS, "--target", str(tiny_dir), "--out", str(out), "--resume", "--limit", "1"]) == 2
    monkeypatch.setattr(ev, "run_sample", real)
    calls["n"] = 0
    code = main([*EVAL_ARGS, "--target", str(tiny_dir), "--out", str(out), "--resume"])
    assert code == 0
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 20 and lines[:6] == kept
    keys = [(json.loads(l)["suite"], json.loads(l)["sample_id"], json.loads(l)["method"]) for l in lines]
    assert len(set(keys)) == 20
    assert json.loads((out / "results.json").read_text())["complete"] is True


def test_resume_after_a_torn_last_line_keeps_every_sample_exactly_once(capsys, tmp_path, tiny_dir, monkeypatch):
    from mars_cli.evaluation import runner as ev

    out = tmp_path / "run"
    real, calls = ev.run_sample, {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(ev, "run_sample", flaky)
    assert main([*EVAL_ARGS, "--target", str(tiny_dir), "--out", str(out)]) == 130
    samples = out / "samples.jsonl"
    whole = samples.read_bytes()
    samples.write_bytes(whole[:-40])  # the crash cut the fourth record short
    monkeypatch.setattr(ev, "run_sample", real)
    capsys.readouterr()
    assert main([*EVAL_ARGS, "--target", str(tiny_dir), "--out", str(out), "--resume"]) == 0
    assert "dropped 1 torn line" in capsys.readouterr().err
    lines = samples.read_text().splitlines()
    keys = [tuple(json.loads(line)[k] for k in ("suite", "sample_id", "method")) for line in lines]
    assert len(lines) == 20 and len(set(keys)) == 20  # every sample once, none glued to the torn bytes
    assert lines[:3] == whole.decode().splitlines()[:3]
    assert main([*EVAL_ARGS, "--target", str(tiny_dir), "--out", str(out), "--resume"]) == 0
    assert samples.read_text().splitlines() == lines  # nothing left to run, nothing duplicated


def test_sample_log_repairs_merged_lines_and_duplicates(tmp_path, capsys):
    """A file damaged by an older version (a torn record with the next one glued to it, then
    recomputed duplicates) loads with each finished sample once and is rewritten clean."""
    from mars_cli.evaluation.runner import SampleLog

    def record(i: int) -> str:
        return json.dumps({"suite": "s", "sample_id": str(i), "method": "vanilla", "output": "x" * 10})

    path = tmp_path / "samples.jsonl"
    path.write_text(f"{record(0)}\n{record(1)[:25]}{record(2)}\n{record(3)}\n{record(0)}\n")
    log = SampleLog(path)
    assert [r["sample_id"] for r in log.records] == ["0", "3"]
    assert "dropped 1 torn line" in capsys.readouterr().err
    log.append(json.loads(record(1)))
    assert [json.loads(line)["sample_id"] for line in path.read_text().splitlines()] == ["0", "3", "1"]


def test_gate_failure_exits_1_with_summary(capsys, tiny_dir):
    code = main(["eval", "--suite", "math", "--limit", "1", "-n", "6", "--device", "cpu", "--target", str(tiny_dir),
                 "--methods", "strict", "--min-speedup", "1000"])
    err = capsys.readouterr().err
    assert code == 1 and "gate failed: strict: speedup" in err


def test_multi_turn_jsonl_runs_turn_by_turn(capsys, tmp_path, tiny_dir):
    suite = tmp_path / "mt.jsonl"
    suite.write_text('{"id": "conv", "turns": ["first question", "and a follow-up"]}\n'
                     '{"id": "single", "prompt": "just one", "reference": "one"}\n')
    out = tmp_path / "run"
    code = main(["eval", "--suite", str(suite), "--methods", "strict", "-n", "6", "--device", "cpu",
                 "--target", str(tiny_dir), "--out", str(out)])
    assert code == 0
    records = {(r["sample_id"], r["method"]): r for r in
               (json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines())}
    assert len(records[("conv", "vanilla")]["turns"]) == 2
    assert records[("single", "vanilla")]["turns"] is None
    assert records[("conv", "strict")]["token_ids"] == records[("conv", "vanilla")]["token_ids"]
    assert records[("single", "strict")]["task_score"] is not None  # ROUGE-L against the reference


def test_methods_share_one_loaded_draft_model(tiny_target, tiny_draft_dir):
    from mars_cli.evaluation.runner import build_sessions
    from mars_cli.options import DecodingOptions

    base = DecodingOptions.of(target=str(tiny_target.spec), draft=str(tiny_draft_dir), device="cpu", max_new_tokens=4)
    sessions = build_sessions(base, parse_methods("strict,mars", [0.9]), tiny_target)
    drafts = {name: session.draft_model for name, session in sessions.items()}
    assert drafts["vanilla"] is None
    models = {id(model) for name, model in drafts.items() if name != "vanilla"}
    assert len(models) == 1  # loaded once, not once per method


def test_methods_take_a_tree_shape_and_sweep_tree_adds_every_shape():
    from mars_cli.evaluation.methods import parse_methods, parse_tree_sweep

    methods = parse_methods("strict:head+4x16,mars", [], parse_tree_sweep("1,8x32"))
    changes = {m.name: m.changes for m in methods}
    assert list(changes) == ["vanilla", "strict:head+4x16", "mars", "mars+1", "mars+8x32"]
    assert changes["strict:head+4x16"] == {"verify": "strict", "draft": "head", "draft_topk": 4, "draft_tokens": 16}
    assert changes["mars+1"] == {"verify": "mars", "draft_topk": 1}
    assert changes["mars+8x32"] == {"verify": "mars", "draft_topk": 8, "draft_tokens": 32}
    with pytest.raises(UserError, match="tree shape"):
        parse_tree_sweep("4by16")
