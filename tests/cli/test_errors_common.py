"""The error matrix, what every subcommand shares: models, decoding flags, seeds, prompts, --out,
and every file the tool reads, through the real entry point with bad input. Each must give exit
code 2 and one line on stderr naming the problem, with no traceback."""

from __future__ import annotations

import json

import pytest

from mars_cli.cli import main

from .errors_helpers import MODEL, one_line_error


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


def test_debug_shows_the_traceback(tiny_dir):
    with pytest.raises(Exception, match="--top-p"):
        main(["--debug", "generate", "hi", "--target", str(tiny_dir), "--top-p", "5"])


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


@pytest.mark.parametrize("command", ["calibrate", "train-head"])
def test_prompts_file_that_is_not_utf8(capsys, tmp_path, tiny_dir, no_model, command):
    prompts = tmp_path / "prompts.jsonl"
    data = b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n'
    prompts.write_bytes(data)
    extra = ["--out", str(tmp_path / "head")] if command == "train-head" else []
    one_line_error(capsys, [command, "--target", str(tiny_dir), "--prompts", str(prompts), *extra, *MODEL],
                   f"prompts file {prompts} is not valid UTF-8 (byte {data.index(0xE9)})")


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
