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
                           *MODEL], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""
