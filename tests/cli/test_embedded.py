"""End to end on the embedded SmolLM2-135M-Instruct (real weights, real tokenizer)."""

from __future__ import annotations

import json

import pytest
import torch

from mars_cli.cli import main
from mars_cli.options import DecodingOptions
from mars_cli.session import Session

pytestmark = pytest.mark.embedded

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the square of a number.",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
]


def hf_greedy(loaded, prompt_ids: list[int], max_new: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=max_new, pad_token_id=loaded.tokenizer.eos_token_id)
    return out[0, len(prompt_ids):].tolist()


def test_generate_cli_matches_transformers_greedy(capsys, smollm2):
    code = main(["generate", PROMPTS[0], "--json", "-n", "24", "--draft", "none"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    session = Session(DecodingOptions.of(max_new_tokens=24), target=smollm2)
    expected = hf_greedy(smollm2, session.encode(PROMPTS[0]), 24)
    assert payload["token_ids"] == expected
    assert "Paris" in payload["text"]
    assert payload["stats"]["mean_accepted"] == 1.0 and payload["stats"]["rounds"] == payload["new_tokens"]
    assert payload["config"]["target"] == "smollm2-135m"


def test_default_generate_drafts_head_trees_losslessly_in_float32(capsys, smollm2):
    """The default drafter is the shipped head; as a tree (forced: float32 auto picks chains on a
    CPU where width is dear) strict decoding is still the target's own greedy output."""
    code = main(["generate", PROMPTS[1], "--json", "-n", "32", "--dtype", "float32", "--draft-topk", "4",
                 "--draft-tokens", "16", "--num-draft", "5"])
    payload = json.loads(capsys.readouterr().out)
    session = Session(DecodingOptions.of(max_new_tokens=32, draft="none"), target=smollm2)
    assert code == 0 and payload["config"]["drafter"] == "head" and payload["stats"]["tree"] is not None
    assert payload["token_ids"] == hf_greedy(smollm2, session.encode(PROMPTS[1]), 32)
    assert payload["stats"]["mean_accepted"] > 1.0


@pytest.mark.parametrize("draft", ["ngram", "head"])
def test_strict_speculative_output_is_lossless(smollm2, draft):
    for prompt in PROMPTS:
        session = Session(DecodingOptions.of(draft=draft, max_new_tokens=40), target=smollm2)
        ids = session.encode(prompt)
        assert session.run(ids).token_ids == hf_greedy(smollm2, ids, 40), prompt


def test_mars_accepts_more_per_round_than_strict(smollm2):
    tau = {}
    for rule in ("strict", "mars"):
        # the paper's theta: the shipped profile's is conservative under greedy decoding; a fixed
        # draft length, since --num-draft auto's choices follow measured times
        session = Session(DecodingOptions.of(draft="ngram", num_draft=4, verify=rule, threshold=0.9,
                                             max_new_tokens=60),
                          target=smollm2)
        rounds = tokens = 0
        for prompt in PROMPTS:
            result = session.run(prompt)
            rounds += result.stats.rounds
            tokens += result.stats.new_tokens
        tau[rule] = tokens / rounds
    assert tau["mars"] > tau["strict"], tau


def test_shipped_head_matches_the_embedded_model_and_drafts_well(smollm2):
    """The shipped head is found by fingerprint and its drafts are accepted far more often than
    chance: a guard against shipping a head trained for other weights or broken by a refactor."""
    # a fixed k: --num-draft auto may choose not to draft where drafting does not pay
    session = Session(DecodingOptions.of(draft="head", num_draft=4, max_new_tokens=60), target=smollm2)
    assert session.config()["drafter"] == "head" and "smollm2-135m" in session.config()["draft_head"]
    rounds = tokens = 0
    for prompt in PROMPTS:
        stats = session.run(prompt).stats
        rounds += stats.rounds
        tokens += stats.new_tokens
    assert tokens / rounds > 1.2, tokens / rounds  # 1.38 measured; a mismatched head gives about 1.0
