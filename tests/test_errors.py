"""The error matrix: every subcommand, through the real entry point, with bad input. Each must
give exit code 2 and one line on stderr naming the problem, with no traceback."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import pytest

from mars_cli.cli import main
from mars_cli.errors import UserError


def one_line_error(capsys, args: list[str], expected: str) -> None:
    code = main(args)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2, (code, captured.err)
    assert len(lines) == 1 and expected in lines[0], captured.err
    assert "Traceback" not in captured.err


@pytest.fixture()
def files(tmp_path, tiny_dir):
    """Broken inputs of every kind, made fresh for each test."""
    made = {}
    made["empty_gguf"] = tmp_path / "empty.gguf"
    made["empty_gguf"].write_bytes(b"")
    made["truncated_gguf"] = tmp_path / "truncated.gguf"
    made["truncated_gguf"].write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x01" * 10)
    truncated_dir = tmp_path / "truncated-safetensors"
    shutil.copytree(tiny_dir, truncated_dir)
    weights = truncated_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])
    made["truncated_dir"] = truncated_dir
    pickle_dir = tmp_path / "pickle-only"
    shutil.copytree(tiny_dir, pickle_dir)
    from safetensors.torch import load_file
    import torch

    torch.save(load_file(pickle_dir / "model.safetensors"), pickle_dir / "pytorch_model.bin")
    (pickle_dir / "model.safetensors").unlink()
    made["pickle_dir"] = pickle_dir
    made["bad_yaml"] = tmp_path / "bad.yaml"
    made["bad_yaml"].write_text("schema: 1\nmodel: [unclosed\n")
    made["empty_yaml"] = tmp_path / "empty.yaml"
    made["empty_yaml"].write_text("")
    made["bad_jsonl"] = tmp_path / "bad.jsonl"
    made["bad_jsonl"].write_text('{"prompt": "fine"}\n{"prompt": "also fine"}\n{"prompt": oops}\n')
    made["a_file"] = tmp_path / "plain-file"
    made["a_file"].write_text("not a directory")
    return made


MODEL = ["--device", "cpu"]


@pytest.mark.parametrize("command", ["generate", "profile", "calibrate", "eval"])
@pytest.mark.parametrize(
    "target, expected",
    [("no-such-model", "unknown model"), ("empty_gguf", "cannot load model"),
     ("truncated_gguf", "cannot load model"), ("truncated_dir", "cannot load model"),
     ("pickle_dir", "--allow-pickle")],
)
def test_bad_models_in_every_command(capsys, files, command, target, expected):
    spec = str(files[target]) if target in files else target
    args = [command] + (["hello"] if command == "generate" else []) + ["--target", spec, *MODEL]
    one_line_error(capsys, args, expected)


def test_pickle_checkpoint_loads_with_explicit_flag(capsys, files):
    code = main(["generate", "hi", "--target", str(files["pickle_dir"]), "--allow-pickle", "-n", "3", "--json", *MODEL])
    assert code == 0 and json.loads(capsys.readouterr().out)["new_tokens"] <= 3


@pytest.mark.parametrize("command", ["generate", "profile", "eval"])
@pytest.mark.parametrize(
    "flags, expected",
    [(["--threshold", "nan"], "--threshold"), (["--threshold", "-0.5"], "--threshold"),
     (["--threshold", "2"], "--threshold"), (["--temperature", "-0.1"], "--temperature"),
     (["--top-p", "0"], "--top-p"), (["--top-p", "1.01"], "--top-p"), (["--top-k", "-1"], "--top-k"),
     (["--num-draft", "0"], "--num-draft"), (["--num-draft", "100000"], "--num-draft"),
     (["--max-new-tokens", "0"], "--max-new-tokens"), (["--max-new-tokens", "100000"], "context window"),
     (["--calibration", "bad_yaml"], "not valid YAML"), (["--calibration", "empty_yaml"], "YAML mapping"),
     (["--calibration", "missing.yaml"], "profile not found")],
)
def test_bad_decoding_flags_in_every_command(capsys, files, tiny_dir, command, flags, expected):
    flags = [str(files[f]) if f in files else f for f in flags]
    if "--calibration" in flags:
        flags = flags + ["--verify", "mars"] if command != "eval" else flags
    args = [command] + (["hello"] if command == "generate" else []) + ["--target", str(tiny_dir), *flags, *MODEL]
    one_line_error(capsys, args, expected)


def test_prompt_longer_than_context_window(capsys, tiny_dir):
    one_line_error(capsys, ["generate", "x" * 400, "--target", str(tiny_dir), *MODEL], "context window")


def test_non_utf8_stdin(monkeypatch, capsys, tiny_dir):
    class Stdin(io.TextIOWrapper):
        def isatty(self) -> bool:
            return False

    monkeypatch.setattr(sys, "stdin", Stdin(io.BytesIO(b"caf\xe9 \xff")))
    one_line_error(capsys, ["generate", "-", "--target", str(tiny_dir), *MODEL], "not valid UTF-8")


def test_calibrate_errors(capsys, files, tiny_dir):
    base = ["calibrate", "--target", str(tiny_dir), *MODEL]
    one_line_error(capsys, [*base, "--objective", "speed=1"], "--objective")
    one_line_error(capsys, [*base, "--prompts", str(files["bad_jsonl"])], "line 3")
    one_line_error(capsys, [*base, "--prompts", str(files["a_file"].parent / "none.jsonl")], "cannot read")
    one_line_error(capsys, [*base, "--out", str(files["a_file"] / "p.yaml")], "cannot create")
    one_line_error(capsys, [*base, "--samples", "3"], "--samples")
    one_line_error(capsys, [*base, "--resume", "--out", str(files["a_file"].parent / "never.yaml")], "nothing to resume")


def test_profile_errors(capsys, files, tiny_dir):
    base = ["profile", "--target", str(tiny_dir), *MODEL]
    one_line_error(capsys, [*base, "--sweep-num-draft", "0:4"], "--sweep-num-draft")
    one_line_error(capsys, [*base, "--bucket", "0"], "--bucket")
    one_line_error(capsys, [*base, "--plot", str(files["a_file"] / "x.png")], "cannot create")


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


def test_debug_shows_the_traceback(tiny_dir):
    with pytest.raises(Exception, match="--top-p"):
        main(["--debug", "generate", "hi", "--target", str(tiny_dir), "--top-p", "5"])


# ----------------------------------------------------------------------------- interrupts
def test_ctrl_c_during_generate_keeps_the_text_and_exits_130(capsys, monkeypatch, tiny_dir):
    """Ctrl-C arrives as KeyboardInterrupt in the middle of decoding (after some rounds)."""
    from mars_cli.session import Session

    real_stream = Session.stream

    def interrupted_stream(self, *args, **kwargs):
        for index, chunk in enumerate(real_stream(self, *args, **kwargs)):
            if index == 5:
                raise KeyboardInterrupt
            yield chunk

    monkeypatch.setattr(Session, "stream", interrupted_stream)
    code = main(["generate", "abc abc", "--target", str(tiny_dir), "--raw", "-n", "50", *MODEL])
    captured = capsys.readouterr()
    assert code == 130
    assert len(captured.out.strip()) >= 3  # the five rounds already decoded were printed
    assert "interrupted" in captured.err and "Traceback" not in captured.err


def test_calibrate_resume_gives_the_same_profile(capsys, tmp_path, tiny_dir, monkeypatch):
    from mars_cli.calibration import profiles as calibration_profiles

    args = ["calibrate", "--target", str(tiny_dir), "--samples", "90", "-n", "10", "--seed", "5", *MODEL]
    main([*args, "--out", str(tmp_path / "whole.yaml")])
    calls = {"n": 0}
    original_run = __import__("mars_cli.session", fromlist=["Session"]).Session.run

    def interrupted_run(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return original_run(self, *a, **k)

    monkeypatch.setattr("mars_cli.session.Session.run", interrupted_run)
    out = tmp_path / "resumed.yaml"
    assert main([*args, "--out", str(out)]) == 130
    assert not out.exists() and (tmp_path / "resumed.yaml.partial.json").exists()
    monkeypatch.setattr("mars_cli.session.Session.run", original_run)
    assert main([*args, "--out", str(out), "--resume"]) == 0
    capsys.readouterr()
    assert not (tmp_path / "resumed.yaml.partial.json").exists()
    whole, resumed = calibration_profiles.load(tmp_path / "whole.yaml").data, calibration_profiles.load(out).data
    assert resumed["thresholds"] == whole["thresholds"] and resumed["quantiles"] == whole["quantiles"]


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


# ----------------------------------------------------------------------------- issue 17
@pytest.mark.parametrize("command", ["generate", "eval", "profile", "calibrate"])
@pytest.mark.parametrize("seed", ["18446744073709551617", "-9223372036854775809"])
def test_seed_outside_what_torch_accepts(capsys, tiny_dir, command, seed):
    args = [command] + (["hello"] if command == "generate" else []) + ["--target", str(tiny_dir), "--seed", seed]
    one_line_error(capsys, [*args, "-n", "3", *MODEL], "--seed must be an integer between")


def test_largest_seeds_still_work(capsys, tiny_dir):
    for seed in ("9223372036854775807", "-9223372036854775808"):
        assert main(["generate", "hi", "--target", str(tiny_dir), "--temperature", "1", "--draft", "ngram",
                     "--seed", seed, "-n", "3", "--json", *MODEL]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("command", ["generate", "profile"])
def test_prompt_argument_that_is_not_utf8(capsys, tiny_dir, command):
    """`mars generate $'abc\\xff'`: Python hands the byte over as a lone surrogate."""
    prompt = b"abc\xff".decode("utf-8", "surrogateescape")
    one_line_error(capsys, [command, prompt, "--target", str(tiny_dir), *MODEL], "not valid UTF-8 (byte 3)")


def test_out_into_a_missing_parent_creates_only_the_last_level(capsys, tmp_path, tiny_dir):
    deep = tmp_path / "typo" / "nested"
    one_line_error(capsys, ["calibrate", "--target", str(tiny_dir), "--out", str(deep / "p.yaml"), *MODEL],
                   "does not exist")
    one_line_error(capsys, ["eval", "--target", str(tiny_dir), "--out", str(deep / "run"), *MODEL], "does not exist")
    one_line_error(capsys, ["profile", "--target", str(tiny_dir), "--plot", str(deep / "x.png"), *MODEL],
                   "only the last level")
    assert not (tmp_path / "typo").exists()
    assert main(["eval", "--suite", "math", "--limit", "1", "-n", "2", "--methods", "vanilla", "--target",
                 str(tiny_dir), "--out", str(tmp_path / "run"), *MODEL]) == 0  # one missing level is made
    capsys.readouterr()


def test_closed_output_pipe_exits_quietly_with_141(tiny_dir):
    """`mars generate ... | head -c 5`: the reader is gone; no traceback, no exit 1 (kept for gates)."""
    import os
    import subprocess

    script = Path(sys.executable).with_name("mars")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has already gone: the first write fails, deterministically
    done = subprocess.run([str(script), "generate", "hello there", "--target", str(tiny_dir), "--raw", "-n", "20",
                           *MODEL, "--dtype", "float32", "--packed-weights", "off"],  # auto would measure, and say so
                          stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


# ----------------------------------------------------------------------------- issue 24, item 5
@pytest.fixture()
def no_model(monkeypatch):
    """These refusals must come before any model loads (one took 38 s): loading fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr("mars_cli.models.load_model", refuse)


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
    root = Path(__file__).resolve().parent.parent
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


@pytest.mark.parametrize("command", ["calibrate", "train-head"])
def test_prompts_file_that_is_not_utf8(capsys, tmp_path, tiny_dir, no_model, command):
    prompts = tmp_path / "prompts.jsonl"
    data = b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n'
    prompts.write_bytes(data)
    extra = ["--out", str(tmp_path / "head")] if command == "train-head" else []
    one_line_error(capsys, [command, "--target", str(tiny_dir), "--prompts", str(prompts), *extra, *MODEL],
                   f"prompts file {prompts} is not valid UTF-8 (byte {data.index(0xE9)})")


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


def _shipped_profile() -> dict:
    import yaml

    from mars_cli.calibration import profiles

    return yaml.safe_load((profiles.SHIPPED_DIR / "smollm2-135m.yaml").read_text())


def _edit(data: dict, change) -> dict:
    change(data)
    return data


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["objective"].update(value="two percent"), "field 'objective.value' must be a number"),
    (lambda d: d["modes"]["greedy"].update(objective="quality=0.02"), "field 'modes.greedy.objective.value'"),
    (lambda d: d["modes"]["greedy"]["sweep"].update(chosen="0.9"), "field 'modes.greedy.sweep.chosen'"),
    (lambda d: d["modes"]["greedy"]["sweep"]["rows"][0]["metrics"]["mean_logprob"].update(drop="lots"),
     "field 'modes.greedy.sweep.rows[0].metrics.mean_logprob'"),
    (lambda d: d["modes"]["sampled"]["sweep"].pop("strict"), "field 'modes.sampled.sweep.strict.tau'"),
])
def test_replot_of_a_hand_edited_profile_is_one_line(capsys, tmp_path, change, expected):
    import yaml

    source = tmp_path / "edited.yaml"
    source.write_text(yaml.safe_dump(_edit(_shipped_profile(), change)))
    one_line_error(capsys, ["calibrate", "--replot", str(source), "--plot", str(tmp_path / "p.png")], expected)


def test_replot_draws_rows_without_metrics_and_a_sweep_without_a_choice(capsys, tmp_path):
    import yaml

    def strip(data: dict) -> None:
        for block in data["modes"].values():
            block["sweep"].pop("chosen")
            for row in block["sweep"]["rows"]:
                row.pop("metrics")

    source = tmp_path / "edited.yaml"
    source.write_text(yaml.safe_dump(_edit(_shipped_profile(), strip)))
    assert main(["calibrate", "--replot", str(source), "--plot", str(tmp_path / "p.png")]) == 0, capsys.readouterr().err
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("args, expected", [
    (["eval", "--sweep", "0.8:0.9:1e-9"], "at most 1000"),
    (["eval", "--sweep", "0.8:0.9:inf"], "STEP > 0"),
    (["profile", "--sweep-num-draft", "1:10000000000"], "draft lengths must lie in 1..64"),
    (["eval", "--methods", "strict:head+0x0"], "method 'strict:head+0x0': tree shape '0x0': TOPK must be between 1"),
    (["eval", "--methods", "strict+abc"], "method 'strict+abc': tree shape 'abc': expected TOPKxTOKENS"),
    (["eval", "--methods", "mars+4x100"], "TOKENS between 1 and 64"),
    (["eval", "--sweep-tree", "1,0x0"], "--sweep-tree shape '0x0'"),
    (["eval", "--sweep-tree", "+abc"], "--sweep-tree shape '+abc'"),
    (["calibrate", "--objective", "quality=0.02", "--draft", "none"], "--draft none relaxes nothing"),
    (["eval", "--out", "/proc/mars-x"], "cannot create /proc/mars-x: /proc does not accept new files"),
])
def test_flags_refused_before_loading(capsys, tiny_dir, no_model, args, expected):
    one_line_error(capsys, [*args, "--target", str(tiny_dir), *MODEL], expected)


# train-head --resume: the checkpoint records its options, checked before the target loads
def _checkpoint(path: Path, **changes) -> None:
    import hashlib

    import torch

    from mars_cli.head.data import HEAD_PROMPTS
    from mars_cli.training import HeadRecipe

    options = HeadRecipe().resume_options(hashlib.sha256(HEAD_PROMPTS.read_bytes()).hexdigest())
    options.update(changes)
    torch.save({"step": 3, "head": {}, "optimizer": {}, "losses": [1.0], "options": options}, path)


@pytest.mark.parametrize("flags, recorded, expected", [
    (["--vocab", "100"], {}, "--resume: --vocab differs from the interrupted run (8192 there, 100 now)"),
    (["--lr", "0.01"], {}, "--resume: --lr differs from the interrupted run (0.001 there, 0.01 now)"),
    ([], {"--prompts": "0" * 64}, "--resume: --prompts differs"),
    ([], None, "does not record its options"),
])
def test_train_head_resume_checks_the_recorded_options(capsys, tmp_path, tiny_dir, no_model, flags, recorded,
                                                       expected):
    import torch

    head = tmp_path / "head"
    checkpoint = tmp_path / "head.ckpt"
    if recorded is None:  # made by an older mars
        torch.save({"step": 3, "head": {}, "optimizer": {}, "losses": [1.0]}, checkpoint)
    else:
        _checkpoint(checkpoint, **recorded)
    one_line_error(capsys, ["train-head", "--target", str(tiny_dir), "--out", str(head), "--resume", *flags, *MODEL],
                   expected)
    assert checkpoint.is_file()  # nothing already written is lost


def test_train_head_resume_without_a_checkpoint_is_refused(capsys, tmp_path, tiny_dir, no_model):
    head = tmp_path / "head"
    one_line_error(capsys, ["train-head", "--target", str(tiny_dir), "--out", str(head), "--resume", *MODEL],
                   f"nothing to resume: there is no checkpoint {tmp_path / 'head.ckpt'}")
    (tmp_path / "head.ckpt").write_bytes(b"not a checkpoint")
    one_line_error(capsys, ["train-head", "--target", str(tiny_dir), "--out", str(head), "--resume", *MODEL],
                   "cannot read the checkpoint")


def test_profile_over_the_size_cap_is_refused_unread(capsys, tmp_path, no_model):
    from mars_cli.inputs import PROFILE_LIMIT

    big = tmp_path / "big.yaml"
    with open(big, "w") as handle:
        handle.write("schema: 2\n")
        handle.truncate(PROFILE_LIMIT + 1)  # sparse: the size is what counts
    one_line_error(capsys, ["calibrate", "--replot", str(big), "--plot", str(tmp_path / "p.png")],
                   f"profile {big} is too large ({PROFILE_LIMIT + 1:,} bytes; the limit is 4 MiB)")


# every other file the tool reads, against the same families: not UTF-8, too large, not a
# regular file (a FIFO would block forever), a directory
READERS = {
    "eval --suite": (".jsonl", lambda p, t: ["eval", "--suite", str(p), "--target", str(t)]),
    "calibrate --prompts": (".jsonl", lambda p, t: ["calibrate", "--prompts", str(p), "--target", str(t)]),
    "train-head --prompts": (".jsonl", lambda p, t: ["train-head", "--prompts", str(p), "--target", str(t),
                                                     "--out", str(p.parent / "head")]),
    "calibrate --replot": (".yaml", lambda p, t: ["calibrate", "--replot", str(p), "--plot",
                                                  str(p.parent / "p.png")]),
    "--calibration": (".yaml", lambda p, t: ["generate", "hi", "--calibration", str(p), "--verify", "mars",
                                             "--target", str(t)]),
}
FAMILIES = {
    "not UTF-8": "is not valid UTF-8 (byte",
    "too large": "is too large",
    "a FIFO": "is not a regular file",
    "a directory": "is a directory; name a file",
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("reader", READERS)
def test_every_file_the_tool_reads(capsys, monkeypatch, tmp_path, tiny_dir, reader, family):
    import os

    suffix, command = READERS[reader]
    path = tmp_path / f"input{suffix}"
    if family == "not UTF-8":
        path.write_bytes(b'{"prompt": "caf\xe9"}\n' if suffix == ".jsonl" else b"schema: 2\nmodel: caf\xe9\n")
    elif family == "too large":
        for name in ("JSONL_LIMIT", "PROFILE_LIMIT"):
            monkeypatch.setattr(f"mars_cli.inputs.{name}", 64)
        path.write_text('{"prompt": "hello"}\n' * 10)
    elif family == "a FIFO":
        os.mkfifo(path)
    else:
        path.mkdir()
    if reader != "--calibration":  # the only one read after the (tiny) target loads
        monkeypatch.setattr("mars_cli.models.load_model",
                            lambda *a, **k: pytest.fail("the model was loaded before the file was checked"))
    one_line_error(capsys, [*command(path, tiny_dir), *MODEL], FAMILIES[family])


@pytest.mark.parametrize("content, expected", [
    (b"\xff\xfe", "resume file"),
    (b"[1, 2]", "not a calibration's resume file"),
    (b'{"signature": null}', "the options differ"),
])
def test_calibrate_resume_file_that_is_damaged(capsys, tmp_path, tiny_dir, no_model, content, expected):
    out = tmp_path / "p.yaml"
    (tmp_path / "p.yaml.partial.json").write_bytes(content)
    one_line_error(capsys, ["calibrate", "--target", str(tiny_dir), "--out", str(out), "--resume", *MODEL], expected)


def test_calibrate_resume_file_with_malformed_positions(capsys, tmp_path, tiny_dir, monkeypatch, no_model):
    from mars_cli.calibration import collection

    real = collection.load_partial

    def spy(path, signature):  # the run's own signature, positions that are not numbers
        path.write_text(json.dumps({"signature": signature, "fit": [["a", "b"]], "held": None}))
        return real(path, signature)

    monkeypatch.setattr("mars_cli.calibration.run.load_partial", spy)
    out = tmp_path / "p.yaml"
    (tmp_path / "p.yaml.partial.json").write_text("{}")
    one_line_error(capsys, ["calibrate", "--target", str(tiny_dir), "--out", str(out), "--resume", *MODEL],
                   "is damaged")


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


def test_head_data_log_with_bytes_that_are_not_utf8_or_a_fifo(tmp_path):
    """train-head's resume log of generated answers: damaged lines are generated again; a FIFO
    in its place is one sentence, not a hang."""
    import os

    from mars_cli.head.data import read_generations

    log = tmp_path / "generations.jsonl"
    good = {"index": 1, "mode": "greedy", "prompt_ids": [1, 2], "output_ids": [3]}
    log.write_bytes(b'{"index": 0, "prompt_ids": [1], "outp\xff\xfe\n' + json.dumps(good).encode() + b"\n[1]\n")
    assert list(read_generations(log)) == [1]
    log.unlink()
    os.mkfifo(log)
    with pytest.raises(UserError, match="is not a regular file"):
        read_generations(log)
