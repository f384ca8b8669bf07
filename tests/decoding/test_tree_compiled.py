"""Draft trees through the compiled forward (real `torch.compile` on the static cache)."""

from __future__ import annotations

import random

import pytest

from mars_cli.decoding.loop import DecodeSettings, decode
from mars_cli.decoding.target import TargetScorer
from mars_cli.decoding.verifiers import Verifier

from .test_loop import hf_greedy, random_prompt
from ..trees import RandomTreeDrafter


def test_compiled_tree_decoding_equals_the_target(tiny_target):
    """Real `torch.compile` on the static cache: tree rounds pass their mask and positions into the
    compiled forward (one graph for the tree's width, one for plain steps) and decode as eager."""
    from mars_cli.decoding.target import compile_unavailable, resolve_compile
    from mars_cli.errors import UserError

    if compile_unavailable(tiny_target.device):  # without a compiler the promise is a clear refusal
        with pytest.raises(UserError, match="--compile on: "):
            resolve_compile("on", tiny_target)
        return
    vocab = len(tiny_target.tokenizer)
    prompt = random_prompt(random.Random(7), vocab, 13)
    expected = hf_greedy(tiny_target, prompt, 20)
    scorer = TargetScorer(tiny_target, compile=True, headroom=40)
    drafter = RandomTreeDrafter(len(prompt), expected + [3] * 8, vocab, 6, 0)
    tokens: list[int] = []
    for chunk in decode(scorer, drafter, Verifier("strict"), prompt, DecodeSettings(20, 4, tree_tokens=6)):
        tokens.extend(chunk)
    assert tokens == expected and scorer.kind == "compiled" and scorer.compiled_widths <= {1, 7}


