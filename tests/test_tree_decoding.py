"""Draft trees through the loop: one target pass scores every branch as sequential decoding would,
strict greedy verification over any drafter's trees reproduces the target's own output, sampling
follows its distribution, and the cache after an accepted side branch equals a fresh forward."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mars_cli.decoding.drafters import ModelDrafter, NgramDrafter, NoDrafter
from mars_cli.decoding.kv import StaticKVCache
from mars_cli.decoding.loop import DecodeSettings, decode
from mars_cli.decoding.sampling import SamplingParams
from mars_cli.decoding.stats import DecodeStats
from mars_cli.decoding.target import TargetScorer
from mars_cli.decoding.tree import CHAIN, DraftTree, TreeShape
from mars_cli.decoding.verifiers import Verifier
from mars_cli.head.drafter import HeadDrafter
from mars_cli.models import load_model

from .test_head import random_head
from .test_loop import hf_greedy, random_prompt
from .trees import RandomTreeDrafter, decode_all, path_tokens, random_tree


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def attention_target(request, tiny_dir):
    target = load_model(str(tiny_dir), device="cpu", dtype="float32")
    target.model.set_attn_implementation(request.param)
    return target


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_tree_logits_equal_sequential_logits_for_every_node(attention_target, static, seed):
    rng = random.Random(seed)
    target = attention_target
    vocab = len(target.tokenizer)
    prompt = random_prompt(rng, vocab, 12)
    tree = random_tree(rng, 9, vocab)
    scorer = TargetScorer(target, static_cache=static, headroom=32)
    scorer.start(torch.tensor(prompt[:-1]))
    assert isinstance(scorer.cache, StaticKVCache) == static
    logits = scorer.score(torch.tensor(prompt[-1:]), tree, width=12).logits
    with torch.no_grad():
        fresh = target.model(torch.tensor([prompt])).logits[0, -1]
        torch.testing.assert_close(logits[0], fresh, atol=1e-4, rtol=1e-4)
        for node in range(tree.size):
            ids = torch.tensor([prompt + path_tokens(tree, node)])
            torch.testing.assert_close(logits[node + 1], target.model(ids).logits[0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("static", [False, True])
def test_side_branch_leaves_the_cache_of_a_fresh_forward(tiny_target, static):
    """The accepted path runs through the tree's second branch: after `keep` the cache holds what
    a fresh forward over prompt + accepted tokens computes, and decoding continues from it."""
    vocab = len(tiny_target.tokenizer)
    prompt = random_prompt(random.Random(3), vocab, 14)
    truth = hf_greedy(tiny_target, prompt, 3, eos=None)
    decoy = (truth[0] + 1) % vocab or 3
    # node 0: a wrong first token with a child; node 1: the truth, then its two true successors
    tree = DraftTree(torch.tensor([decoy, truth[0], 5, truth[1], truth[2]]), torch.tensor([-1, -1, 0, 1, 3]))
    scorer = TargetScorer(tiny_target, static_cache=static, headroom=32)
    scorer.start(torch.tensor(prompt[:-1]))
    logits = scorer.score(torch.tensor(prompt[-1:]), tree, width=6).logits
    verdict = Verifier("strict").verify(logits, tree)
    assert verdict.accepted_positions == [1, 3, 4]
    scorer.keep([0] + [1 + i for i in verdict.accepted_positions])
    accepted = prompt + truth[:3]
    assert len(scorer.cache) == len(accepted) - 1 + 1  # the prompt's last token and three drafts
    with torch.no_grad():
        fresh = tiny_target.model(torch.tensor([accepted]), use_cache=True)
    for ours, theirs in zip(scorer.cache.cache.layers, fresh.past_key_values.layers):
        length = len(accepted)
        torch.testing.assert_close(ours.keys[..., :length, :], theirs.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.values[..., :length, :], theirs.values, atol=1e-5, rtol=1e-5)
    # the next plain step after the kept path scores what a fresh forward scores
    next_logits = scorer.score(torch.tensor([verdict.next_token]), DraftTree.empty("cpu"), width=1).logits
    with torch.no_grad():
        expected = tiny_target.model(torch.tensor([accepted + [verdict.next_token]])).logits[0, -1]
    torch.testing.assert_close(next_logits[0], expected, atol=1e-4, rtol=1e-4)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(1, 12), max_new=st.integers(1, 30))
def test_strict_greedy_over_random_trees_reproduces_the_target(tiny_target, seed, size, max_new):
    rng = random.Random(seed)
    vocab = len(tiny_target.tokenizer)
    prompt = random_prompt(rng, vocab, rng.choice([2, 9, 20]))
    expected = hf_greedy(tiny_target, prompt, max_new)
    drafter = RandomTreeDrafter(len(prompt), expected + [3] * 8, vocab, size, seed)
    stats = DecodeStats()
    assert decode_all(tiny_target, drafter, prompt, max_new, Verifier("strict"), tree_tokens=size, stats=stats) \
        == expected
    # MARS with a threshold no margin exceeds is strict, on trees too
    drafter = RandomTreeDrafter(len(prompt), expected + [3] * 8, vocab, size, seed)
    assert decode_all(tiny_target, drafter, prompt, max_new, Verifier("mars", threshold=1.0), tree_tokens=size) \
        == expected


@pytest.mark.parametrize("seed", range(4))
def test_head_and_ngram_trees_reproduce_the_target(tiny_target, seed):
    rng = random.Random(seed)
    vocab = len(tiny_target.tokenizer)
    prompt = random_prompt(rng, vocab, 17)
    expected = hf_greedy(tiny_target, prompt, 30)
    head = random_head(tiny_target, seed=seed)
    for topk, tokens in ((2, 5), (4, 12), (3, 20)):
        shape = TreeShape(topk, tokens)
        drafters = [HeadDrafter(head, tiny_target, SamplingParams(0.0), shape=shape),
                    NgramDrafter(tiny_target.device, shape)]
        for drafter in drafters:
            stats = DecodeStats()
            assert decode_all(tiny_target, drafter, prompt, 30, Verifier("strict"), 5, tokens, stats=stats) \
                == expected, (drafter.name, topk, tokens)


def test_head_tree_with_an_oracle_is_accepted_to_full_depth(tiny_target):
    """A head whose first child at every node is the target's next token: each round accepts the
    whole depth, whatever else the tree holds."""
    vocab = len(tiny_target.tokenizer)
    prompt = random_prompt(random.Random(5), vocab, 12)
    expected = hf_greedy(tiny_target, prompt, 24, eos=None)
    drafter = RandomTreeDrafter(len(prompt), expected + [3] * 8, vocab, 10, 0)
    drafter.rng.random = lambda: 0.0  # always plant the truth where it can go
    stats = DecodeStats()
    tokens = decode_all(tiny_target, drafter, prompt, 24, Verifier("strict"), tree_tokens=10, stats=stats)
    assert tokens == expected[: len(tokens)]
    assert stats.summary()["tree"] is not None


@pytest.mark.parametrize("seed", range(3))
def test_draft_model_trees_reproduce_the_target(tiny_target, tiny_draft, seed):
    rng = random.Random(seed)
    vocab = len(tiny_target.tokenizer)
    prompt = random_prompt(rng, vocab, 15)
    expected = hf_greedy(tiny_target, prompt, 30)
    for topk, tokens in ((2, 6), (4, 16)):
        drafter = ModelDrafter(tiny_draft, SamplingParams(0.0), TreeShape(topk, tokens))
        stats = DecodeStats()
        assert decode_all(tiny_target, drafter, prompt, 30, Verifier("strict"), 4, tokens, stats=stats) == expected
        assert stats.tree_rounds > 0


def test_draft_model_tree_drafts_what_its_chain_drafts_first(tiny_draft):
    """The first branch of a draft model's tree at top-k 1 is its greedy chain, computed with the
    tree's mask and positions: the tree search and the masked forwards agree with plain drafting."""
    history = torch.tensor(random_prompt(random.Random(1), len(tiny_draft.tokenizer), 11))
    chain = ModelDrafter(tiny_draft, SamplingParams(0.0)).propose(history, 5)
    tree_drafter = ModelDrafter(tiny_draft, SamplingParams(0.0), TreeShape(3, 15))
    tree = tree_drafter.propose(history, 5)
    node, path, parents = 0, [], tree.parents.tolist()
    while True:  # follow the best child (the first, by score) from the root down
        path.append(int(tree.tokens[node]))
        children = [i for i, p in enumerate(parents) if p == node]
        if not children:
            break
        node = children[0]
    assert path == chain.tokens.tolist()[: len(path)] and len(path) >= 3
    assert len(tree_drafter.cache) == history.numel()  # the drafted rows left its cache


def test_past_a_sliding_window_trees_become_their_first_branch(tmp_path):
    """A model with sliding-window layers: trees while the sequence is within the window, then
    the tree's first branch as a chain; the output stays the target's greedy output."""
    from transformers import MistralConfig, MistralForCausalLM

    from .conftest import build_tokenizer

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                           sliding_window=24, eos_token_id=2, pad_token_id=0)
    model = MistralForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    target = load_model(str(tmp_path), device="cpu", dtype="float32")
    vocab = len(tokenizer)
    prompt = random_prompt(random.Random(2), vocab, 10)
    expected = hf_greedy(target, prompt, 30, eos=None)
    drafter = RandomTreeDrafter(len(prompt), expected + [3] * 8, vocab, 6, 0)
    stats = DecodeStats()
    tokens: list[int] = []
    settings = DecodeSettings(30, 4, tree_tokens=6, ignore_eos=True)
    for chunk in decode(TargetScorer(target), drafter, Verifier("strict"), prompt, settings, None, stats):
        tokens.extend(chunk)
    assert tokens == expected
    assert 0 < stats.tree_rounds < stats.rounds  # trees early, chains past the window


def test_sampled_decoding_with_draft_model_trees_follows_the_target(tiny_target, tiny_draft):
    """End to end through the loop, sampling at T = 1 with draft-model trees (top-3, 8 nodes): the
    first generated token, an accepted child of the root or the correction drawn after all were
    rejected, follows the target's distribution."""
    from mars_cli.decoding.drafters import ModelDrafter
    from mars_cli.decoding.sampling import PositionNoise

    from .test_loop import assert_follows

    sampling = SamplingParams(1.0)
    prompt = [5, 6, 7]
    with torch.no_grad():
        p_first = torch.softmax(tiny_target.model(torch.tensor([prompt])).logits[0, -1].float(), -1)
    draws, counts = 1200, torch.zeros_like(p_first)
    verifier = Verifier("strict", sampling=sampling)
    drafter = ModelDrafter(tiny_draft, sampling, TreeShape(3, 8))
    stats = DecodeStats()
    for draw in range(draws):
        noise = PositionNoise(draw, tiny_target.vocab_size)
        first = decode_all(tiny_target, drafter, prompt, 2, verifier, 3, 8, noise, stats)[0]
        counts[first] += 1
    assert_follows(counts, p_first, draws)
    assert stats.tree_rounds > 0


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("shape", [CHAIN, TreeShape(4, 8), TreeShape(4, 16)], ids=["chain", "4x8", "4x16"])
def test_every_drafter_and_shape_reproduces_the_target(tiny_target, tiny_draft, shape, static):
    """The oracle: in float32 at temperature 0, strict verification reproduces plain greedy
    decoding token for token, for every drafter (none, n-gram branches, head, draft model) and
    every shape, on the growing and the static cache; MARS at a threshold nothing passes too."""
    rng = random.Random(11)
    vocab = len(tiny_target.tokenizer)
    head = random_head(tiny_target, seed=3)
    greedy = SamplingParams(0.0)
    for prompt in (random_prompt(rng, vocab, 9), random_prompt(rng, vocab, 23)):
        expected = hf_greedy(tiny_target, prompt, 24)
        drafters = [NoDrafter(tiny_target.device), NgramDrafter(tiny_target.device, shape),
                    HeadDrafter(head, tiny_target, greedy, shape=shape),
                    ModelDrafter(tiny_draft, greedy, shape)]
        for drafter in drafters:
            for verifier in (Verifier("strict"), Verifier("mars", threshold=1.0)):
                stats = DecodeStats()
                tokens = decode_all(tiny_target, drafter, prompt, 24, verifier, 4, shape.tokens, stats=stats,
                                    static=static)
                assert tokens == expected, (drafter.name, shape, verifier.rule)
                if shape.branches and drafter.name in ("head", "model"):
                    assert stats.tree_rounds > 0
