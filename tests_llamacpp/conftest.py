"""Tests of the llama.cpp engine (`--engine llama.cpp`), run in .venv-llamacpp (`make
test-llamacpp`) on the embedded SmolLM2-135M GGUF. The engine loads once per session."""

from __future__ import annotations

import os

os.environ.setdefault("MARS_SERVER", "off")  # tests decode in their own process: no warm server

import pytest

TARGET = "smollm2-135m"


@pytest.fixture(scope="session")
def target():
    from mars_cli.llamacpp.target import load_target

    return load_target(TARGET)


@pytest.fixture(scope="session")
def prompts(target) -> list[list[int]]:
    """Held-out chat and code prompts through the chat template, and a repetitive one (n-gram
    lookup drafts a lot on it)."""
    from mars_cli.evaluation.suites import load_suite
    from mars_cli.prompts import encode_messages

    texts = [s.turns[0] for s in load_suite("chat", limit=2).samples + load_suite("code", limit=2).samples]
    texts.append("Repeat this list five times: red, green, blue, yellow. red, green, blue, yellow.")
    return [encode_messages(target.tokenizer, [{"role": "user", "content": text}], False) for text in texts]
