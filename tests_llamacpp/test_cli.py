"""`mars generate --engine llama.cpp` end to end on the embedded GGUF, and its one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mars_cli.cli import main

PROMPT = "List the days of the week, then list them again in the same order."


def generate(capsys, *args: str) -> dict:
    code = main(["generate", PROMPT, "--engine", "llama.cpp", "-n", "40", "--json", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_the_default_and_fixed_trees_match_plain_decoding(capsys):
    plain = generate(capsys, "--draft", "none")
    default = generate(capsys)  # --draft auto: n-gram lookup on this engine (no head reads its states)
    assert plain["config"]["engine"] == "llama.cpp" and default["config"]["drafter"] == "ngram"
    assert default["token_ids"] == plain["token_ids"]  # strict: lossless
    assert plain["config"]["dtype"].startswith("gguf-")
    tree = generate(capsys, "--num-draft", "4", "--draft-topk", "4", "--draft-tokens", "16")
    assert tree["token_ids"] == plain["token_ids"] and tree["stats"]["drafted"] > 0


@pytest.mark.parametrize("args, says", [
    (["--draft", "head"], "--engine llama.cpp drafts with n-gram lookup"),
    (["--dtype", "float32"], "runs the GGUF file at its own precision"),
    (["--engine", "onnx"], "--engine onnx: expected transformers or llama.cpp"),
])
def test_refusals_are_one_line(capsys, args, says):
    code = main(["generate", PROMPT, "--engine", "llama.cpp", "-n", "4", *args])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and err[-1].startswith("mars: error: ") and says in err[-1]


def test_tune_measures_the_engines_own_choices(capsys):
    """`mars tune --engine llama.cpp`: the thread count, then the width curve, cached."""
    code = main(["tune", "--engine", "llama.cpp", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = json.loads(captured.out)["choices"]
    assert [row["what"] for row in rows] == ["thread count (llama.cpp)", "cost curve (x width 1)"]
    assert all(Path(row["entry"]).is_file() for row in rows)


def test_a_one_liner_on_llama_cpp_runs_no_transformers_model_code(tmp_path):
    """In a process of its own, with the converted entry's fingerprint remembered (a first call):
    the engine's one-liner loads llama.cpp and the tokenizer, never a transformers model class."""
    import os
    import subprocess
    import sys

    report = ("import atexit, json, sys\n"
              "atexit.register(lambda: sys.stderr.write('MODULES ' + json.dumps(sorted(sys.modules)) + '\\n'))\n"
              "from mars_cli.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    env = dict(os.environ, MARS_SERVER="off")
    command = [sys.executable, "-c", report, "generate", "Hi", "--engine", "llama.cpp", "-n", "4", "--draft", "none"]
    for _ in range(2):  # the first may convert the GGUF and read the fingerprint; the second is the one-liner
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    modules = json.loads(next(line for line in done.stderr.splitlines() if line.startswith("MODULES "))[8:])
    assert "llama_cpp" in modules
    model_code = [m for m in modules if m.startswith("transformers.models.") and ".modeling_" in m
                  and not m.startswith("transformers.models.auto.")]  # auto: the name registry, no model code
    assert model_code == []
    assert "transformers.modeling_utils" not in modules


def test_the_one_liners_default_engine_is_measured_once_and_cached(capsys, tmp_path, monkeypatch):
    """`--engine auto` (generate's default) here, where llama.cpp is installed and the target is a
    GGUF: both engines decode, the faster serves, and the next call reads the verdict."""
    from mars_cli import engine_choice

    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(engine_choice, "_busy", lambda: None)  # a quiet machine: the verdict settles
    first = main(["generate", PROMPT, "-n", "8", "--json"])
    captured = capsys.readouterr()
    assert first == 0, captured.err
    config = json.loads(captured.out)["config"]
    choice = config["engine_choice"]
    assert config["engine"] == choice["engine"] in ("llama.cpp", "transformers") and not choice["cached"]
    assert set(choice["tok_s"]) == {"llama.cpp", "transformers"} and all(r > 0 for r in choice["tok_s"].values())
    assert "--engine auto:" in captured.err
    assert main(["generate", PROMPT, "-n", "8", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)["config"]
    assert again["engine"] == config["engine"] and again["engine_choice"]["cached"]
