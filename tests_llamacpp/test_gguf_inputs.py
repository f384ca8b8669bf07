"""GGUF inputs on `--engine llama.cpp` (issue 67 items 3 and 4), on real processes: a file trained
on 64 positions aborted the process (exit 134, GGML_ASSERT n_outputs_max) for any prompt; files
the header check accepted but that cannot be converted gave tracebacks; absurd metadata built
what it claimed. Each is now an answer or one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models.test_gguf_inputs import write_gguf


def mars(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MARS_CACHE": str(tmp_path / "cache"), "MARS_SERVER": "off",
           "MARS_PROFILES": str(tmp_path / "profiles"), "MARS_HEADS": str(tmp_path / "heads")}
    return subprocess.run([sys.executable, "-m", "mars_cli.cli", "generate", *args, "--engine", "llama.cpp"],
                          capture_output=True, text=True, env=env, timeout=400)


def one_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("mars: note:")]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("mars: error: "), done.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize("draft", [["--draft", "none"], ["--num-draft", "4", "--draft-topk", "4", "--draft-tokens", "16"]])
def test_a_small_context_file_answers_instead_of_aborting(tmp_path, draft):
    path = write_gguf(tmp_path / "small.gguf", overrides={"llama.context_length": 64})
    done = mars(tmp_path, "What is the capital of France?", "-t", str(path), "-n", "40", *draft)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "GGML_ASSERT" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("changes, says", [
    ({"drop": ("general.architecture",)}, "no general.architecture in its metadata"),
    ({"arch": "rwkv7"}, "architecture 'rwkv7' is not one mars can convert"),
    ({"overrides": {"llama.block_count": 10**6}}, "llama.block_count is 1000000"),
    ({"rename": {"token_embd.weight": "token_embx.weight"}}, "lacks token_embd.weight"),
])
def test_files_that_cannot_be_converted_are_one_line(tmp_path, changes, says):
    path = write_gguf(tmp_path / "bad.gguf", **changes)
    assert says in one_line(mars(tmp_path, "Hi", "-t", str(path), "-n", "4"))


def test_a_directory_or_fifo_named_gguf_is_said_to_be_one(tmp_path):
    (tmp_path / "d.gguf").mkdir()
    os.mkfifo(tmp_path / "f.gguf")
    assert "is a directory, not a GGUF file" in one_line(mars(tmp_path, "Hi", "-t", str(tmp_path / "d.gguf")))
    assert "is not a regular file (a FIFO" in one_line(mars(tmp_path, "Hi", "-t", str(tmp_path / "f.gguf")))
