"""Losslessness on the engine: strict greedy decoding with every drafter and tree shape emits
llama.cpp's own plain greedy output token for token, and MARS at theta 1 is strict."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mars_cli.decoding.loop import DecodeSettings, decode
from mars_cli.decoding.drafters import NgramDrafter, NoDrafter
from mars_cli.decoding.tree import CHAIN, DraftTree, TreeShape
from mars_cli.decoding.verifiers import Verifier
from mars_cli.decoding.sampling import SamplingParams
from mars_cli.llamacpp.scorer import COMMITTED, LlamaScorer

NEW_TOKENS = 48


def engine_greedy(target, prompt: list[int], count: int) -> list[int]:
    """llama.cpp's own greedy decoding: the prompt, then one token at a time, argmax of its logits
    (written against the engine, not the scorer)."""
    engine = target.engine
    engine.clear()
    logits = engine.decode(prompt, range(len(prompt)), [(COMMITTED,)] * len(prompt),
                           [False] * (len(prompt) - 1) + [True])
    out = []
    eos = target.eos_token_ids
    while len(out) < count:
        token = int(np.argmax(logits[-1]))
        out.append(token)
        if token in eos:
            break
        position = len(prompt) + len(out) - 1
        logits = engine.decode([token], [position], [(COMMITTED,)], [True])
    return out


def ours(target, prompt: list[int], drafter, rule: str = "strict", threshold: float = 1.0, num_draft: int = 4,
         tree_tokens: int = 0):
    scorer = LlamaScorer(target, target.engine)
    verifier = Verifier(rule=rule, threshold=threshold, measure="logit-ratio", sampling=SamplingParams(0.0))
    settings = DecodeSettings(NEW_TOKENS, num_draft, tree_tokens=tree_tokens)
    from mars_cli.decoding.stats import DecodeStats

    stats = DecodeStats()
    tokens = [t for chunk in decode(scorer, drafter, verifier, prompt, settings, stats=stats) for t in chunk]
    return tokens, stats


@pytest.fixture(scope="module")
def reference(target, prompts):
    return [engine_greedy(target, prompt, NEW_TOKENS) for prompt in prompts]


def test_plain_decoding_on_the_scorer_is_the_engines_greedy(target, prompts, reference):
    for prompt, expected in zip(prompts, reference):
        tokens, _ = ours(target, prompt, NoDrafter(target.device))
        assert tokens == expected


@pytest.mark.parametrize("num_draft", [1, 3, 6])
def test_strict_chains_are_lossless(target, prompts, reference, num_draft):
    drafted = 0
    for prompt, expected in zip(prompts, reference):
        tokens, stats = ours(target, prompt, NgramDrafter(target.device, CHAIN), num_draft=num_draft)
        assert tokens == expected
        drafted += stats.drafted
    assert drafted > 0  # the drafter proposed something: the verification was exercised


@pytest.mark.parametrize("shape", [TreeShape(2, 8), TreeShape(4, 16), TreeShape(8, 32)])
def test_strict_trees_are_lossless(target, prompts, reference, shape):
    branched = 0
    for prompt, expected in zip(prompts, reference):
        tokens, stats = ours(target, prompt, NgramDrafter(target.device, shape), num_draft=6, tree_tokens=shape.tokens)
        assert tokens == expected
        branched += stats.tree_rounds
    assert branched > 0


def test_mars_at_theta_one_is_strict(target, prompts, reference):
    for prompt, expected in zip(prompts, reference):
        tokens, _ = ours(target, prompt, NgramDrafter(target.device, TreeShape(4, 16)), rule="mars", threshold=1.0,
                         num_draft=6, tree_tokens=16)
        assert tokens == expected


def test_each_tree_row_sees_only_its_ancestors(target, prompts):
    """A branching tree scored in one decode gives each node the logits its own path gives when
    fed as a chain (the same argmax, logits within the engine's batch noise)."""
    prompt = prompts[0]
    scorer = LlamaScorer(target, target.engine)
    scorer.start(torch.tensor(prompt[:-1]))
    pending = torch.tensor(prompt[-1:])
    # a root with three children; the first child has two children; one grandchild has a child
    tokens = torch.tensor([100, 200, 300, 110, 120, 111])
    parents = torch.tensor([-1, -1, -1, 0, 0, 3])
    tree = DraftTree(tokens, parents)
    scored = scorer.score(pending, tree, width=7).logits
    scorer.rewind(len(prompt) - 1)
    paths = {0: [0], 1: [1], 2: [2], 3: [0, 3], 4: [0, 4], 5: [0, 3, 5]}
    for node, path in paths.items():
        chain = scorer.score(pending, DraftTree.chain(tokens[path]), width=len(path) + 1).logits
        scorer.rewind(len(prompt) - 1)
        torch.testing.assert_close(scored[1 + node], chain[-1], atol=2e-2, rtol=1e-3)
        assert int(scored[1 + node].argmax()) == int(chain[-1].argmax())


@pytest.mark.parametrize("num_draft", [2, 5])
def test_a_gguf_draft_model_is_lossless(target, prompts, reference, num_draft):
    """The same GGUF drafting for itself: the output the engine's own, and nearly every draft
    accepted, with the draft model's cache following the history round by round (a cache that
    lost its place would have most drafts rejected). Not every draft: the drafter's single-token
    forwards and the target's batched ones sum in different orders (and thread counts), and on an
    AVX2 EPYC one near-tie in 32 drafts flipped."""
    from mars_cli.llamacpp.drafter import LlamaModelDrafter

    drafter = LlamaModelDrafter(target.spec, target, SamplingParams(0.0), threads=2)
    for prompt, expected in zip(prompts[:3], reference[:3]):
        drafter.reset()
        tokens, stats = ours(target, prompt, drafter, num_draft=num_draft)
        assert tokens == expected
        assert stats.drafted > 0 and stats.accepted >= 0.9 * stats.drafted


def test_a_draft_model_samples_what_plain_sampling_draws(target, prompts):
    """Seeded sampling: strict verification with the draft model emits the tokens plain sampling
    draws with the same seed (the drafter draws with the sequence's own noise)."""
    from mars_cli.decoding.sampling import PositionNoise
    from mars_cli.decoding.stats import DecodeStats
    from mars_cli.llamacpp.drafter import LlamaModelDrafter

    params = SamplingParams(0.8)
    verifier = Verifier(rule="strict", threshold=1.0, measure="logit-ratio", sampling=params)
    outputs = []
    for drafter in (NoDrafter(target.device), LlamaModelDrafter(target.spec, target, params, threads=2)):
        scorer = LlamaScorer(target, target.engine)
        noise = PositionNoise(7, target.vocab_size, target.device)
        chunks = decode(scorer, drafter, verifier, prompts[1], DecodeSettings(32, 3), noise, DecodeStats())
        outputs.append([t for chunk in chunks for t in chunk])
    assert outputs[0] == outputs[1]
