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
from mars_cli.head.drafter import LOOKUP_REACH, REPEAT_MATCH, HeadDrafter
from mars_cli.models import load_model

from ..head.test_head import random_head
from .test_loop import hf_greedy, random_prompt
from ..trees import RandomTreeDrafter, decode_all, path_tokens, random_tree


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
                    HeadDrafter(head, tiny_target, SamplingParams(0.0), shape=shape, lookup=True),
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

    from ..conftest import build_tokenizer

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


@pytest.mark.parametrize("kind", ["model", "head+lookup"])
def test_sampled_tree_decoding_follows_the_target(tiny_target, tiny_draft, kind):
    """End to end through the loop, sampling at T = 1 with draft-model trees (top-3, 8 nodes), or
    head trees with prompt lookup's branch grafted on (a grafted branch is a proposal like any
    other, verified as given): the first generated token, an accepted child of the root or the
    correction drawn after all were rejected, follows the target's distribution."""
    from mars_cli.decoding.sampling import PositionNoise

    from .test_loop import assert_follows

    sampling = SamplingParams(1.0)
    prompt = [5, 6, 7, 5, 6]  # lookup continues with 7, 5, 6
    with torch.no_grad():
        p_first = torch.softmax(tiny_target.model(torch.tensor([prompt])).logits[0, -1].float(), -1)
    draws, tokens = (1200, 8) if kind == "model" else (800, 6)
    counts = torch.zeros_like(p_first)
    verifier = Verifier("strict", sampling=sampling)
    drafter = (ModelDrafter(tiny_draft, sampling, TreeShape(3, tokens)) if kind == "model" else
               HeadDrafter(random_head(tiny_target, seed=2), tiny_target, sampling, shape=TreeShape(3, tokens),
                           lookup=True))
    stats = DecodeStats()
    for draw in range(draws):
        noise = PositionNoise(draw, tiny_target.vocab_size)
        first = decode_all(tiny_target, drafter, prompt, 2, verifier, 3, tokens, noise, stats)[0]
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
                    HeadDrafter(head, tiny_target, greedy, shape=shape, lookup=True),
                    ModelDrafter(tiny_draft, greedy, shape)]
        for drafter in drafters:
            for verifier in (Verifier("strict"), Verifier("mars", threshold=1.0)):
                stats = DecodeStats()
                tokens = decode_all(tiny_target, drafter, prompt, 24, verifier, 4, shape.tokens, stats=stats,
                                    static=static)
                assert tokens == expected, (drafter.name, shape, verifier.rule)
                if shape.branches and drafter.name in ("head", "model"):
                    assert stats.tree_rounds > 0


def repeating_prompt(target) -> list[int]:
    """A random phrase twice and its first three tokens: prompt lookup has matches from the start."""
    phrase = random_prompt(random.Random(8), len(target.tokenizer), 12)
    return phrase + phrase + phrase[:3]


class RecordingTrees:
    """Wraps a drafter and keeps every tree it proposes (the loop sees the same trees)."""

    def __init__(self, drafter):
        self.drafter, self.trees = drafter, []

    def __getattr__(self, name):
        return getattr(self.drafter, name)

    def __setattr__(self, name, value):
        if name in ("drafter", "trees"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.drafter, name, value)

    def propose(self, history, depth):
        tree = self.drafter.propose(history, depth)
        self.trees.append((history.clone(), depth, tree))
        return tree


@pytest.mark.parametrize("rule", ["strict", "mars"])
def test_lookup_grafts_the_repeated_text_onto_head_trees(tiny_target, rule):
    """With `lookup`, a head tree keeps its own nodes first, in order, and adds what prompt lookup
    continues with (the text after the latest earlier occurrence of its last tokens) as one more
    branch, past the searched levels after a repeated REPEAT_MATCH tokens: on a prompt that repeats
    itself the trees grow past the head's nodes and its depth, and decoding still reproduces the
    target (strict, and MARS at a threshold nothing passes)."""
    prompt = repeating_prompt(tiny_target)
    expected = hf_greedy(tiny_target, prompt, 20)
    head = random_head(tiny_target, seed=4)
    shape = TreeShape(2, 5)
    verifier = Verifier("strict") if rule == "strict" else Verifier("mars", threshold=1.0)
    grafted = RecordingTrees(HeadDrafter(head, tiny_target, SamplingParams(0.0), shape=shape, lookup=True))
    assert decode_all(tiny_target, grafted, prompt, 20, verifier, 4, shape.tokens) == expected
    own = HeadDrafter(head, tiny_target, SamplingParams(0.0), shape=shape)
    lookup, repeats = NgramDrafter(torch.device("cpu")), NgramDrafter(torch.device("cpu"), min_ngram=REPEAT_MATCH)
    grew = reached = 0
    for history, depth, tree in grafted.trees:
        # after a repeated REPEAT_MATCH tokens the branch runs past the searched levels
        continuation = (repeats.continuations(history, max(depth, LOOKUP_REACH), 1)
                        or lookup.continuations(history, depth, 1) or [[]])[0]
        assert tree.size <= shape.tokens + len(continuation)
        assert tree.depth <= max(depth, len(continuation))
        grew += tree.size > shape.tokens
        reached += tree.depth > depth
        # the continuation is spelled by a path of the tree from the root
        node = -1
        for token in continuation:
            children = [i for i, (t, p) in enumerate(zip(tree.tokens.tolist(), tree.parents.tolist()))
                        if p == node and t == token]
            assert len(children) == 1
            node = children[0]
    assert grew > 0 and reached > 0
    first_history, first_depth, first_tree = grafted.trees[0]
    own.reset()
    scorer = TargetScorer(tiny_target, own.feature_layers, headroom=64)
    own.observe_features(scorer.start(first_history[:-1]))
    alone = own.propose(first_history, first_depth)
    assert first_tree.tokens[: alone.size].tolist() == alone.tokens.tolist()
    assert first_tree.parents[: alone.size].tolist() == alone.parents.tolist()


class LevelsSeen:
    """Stands in for `--num-draft auto`'s chooser: asks for `k` every round, keeps what it is told."""

    def __init__(self, k):
        self.k, self.seen = k, []

    def choose(self, k):
        return min(k, self.k)

    def keep_features(self):
        return True

    def observe(self, drafted, accepted, draft_s, timed_as=None, asked=0, width=None, target_s=None):
        self.seen.append((drafted, accepted, asked))


def test_the_chooser_learns_only_the_levels_it_asked_for(tiny_target):
    """A lookup branch past the round's k levels is verified (the output is still the target's)
    but the draft length chooser is told of the first k levels only: it prices what it chose."""
    prompt = repeating_prompt(tiny_target)
    drafter = RecordingTrees(HeadDrafter(random_head(tiny_target, seed=4), tiny_target, SamplingParams(0.0),
                                         shape=TreeShape(2, 5), lookup=True))
    chooser = LevelsSeen(2)
    scorer = TargetScorer(tiny_target, drafter.feature_layers, headroom=64)
    tokens = [t for chunk in decode(scorer, drafter, Verifier("strict"), prompt, DecodeSettings(20, 4, tree_tokens=5),
                                    draft_length=chooser) for t in chunk]
    assert tokens == hf_greedy(tiny_target, prompt, 20)
    assert any(tree.depth > depth for _, depth, tree in drafter.trees)
    assert chooser.seen and all(drafted <= asked and accepted <= asked for drafted, accepted, asked in chooser.seen)


@pytest.mark.parametrize("rule", ["strict", "mars"])
def test_greedy_chains_take_lookup_after_a_repeated_three_tokens(tiny_target, rule):
    """With `lookup`, a greedy head chain is prompt lookup's continuation whenever the text's last
    three tokens occurred before, and the head's own chain otherwise; decoding still reproduces the
    target. Where lookup applies: trees (a graft) and greedy chains, not sampled chains."""
    prompt = repeating_prompt(tiny_target)
    expected = hf_greedy(tiny_target, prompt, 20)
    head = random_head(tiny_target, seed=4)
    verifier = Verifier("strict") if rule == "strict" else Verifier("mars", threshold=1.0)
    chained = RecordingTrees(HeadDrafter(head, tiny_target, SamplingParams(0.0), lookup=True))
    assert decode_all(tiny_target, chained, prompt, 20, verifier, 4, 0) == expected
    lookup = NgramDrafter(torch.device("cpu"), min_ngram=3)
    matched = 0
    for history, depth, tree in chained.trees:
        assert tree.is_chain()
        continuation = lookup.propose(history, depth).tokens.tolist()
        if continuation:
            matched += 1
            assert tree.tokens.tolist() == continuation
    assert matched > 0
    assert HeadDrafter(head, tiny_target, SamplingParams(0.0), lookup=True).looks_up
    assert not HeadDrafter(head, tiny_target, SamplingParams(1.0), lookup=True).looks_up
    assert not HeadDrafter(head, tiny_target, SamplingParams(0.0)).looks_up
    assert HeadDrafter(head, tiny_target, SamplingParams(1.0), shape=TreeShape(2, 5), lookup=True).looks_up


def test_the_flag_turns_lookup_on_for_head_sessions_only(tiny_dir, tiny_target, tmp_path, capsys):
    """`--draft-lookup`: on (the default) applies to a head session's trees and greedy chains, never
    to another drafter; a bad value is one line, exit 2."""
    from mars_cli.options import DecodingOptions
    from mars_cli.session import Session

    from ..cli.test_cli import run_cli

    path = tmp_path / "head.safetensors"
    random_head(tiny_target, seed=1).save(path)
    options = dict(target=str(tiny_dir), device="cpu", dtype="float32", draft=f"head:{path}", num_draft=3,
                   max_new_tokens=8, draft_topk=2, draft_tokens=5)
    tree = Session(DecodingOptions.of(**options), target=tiny_target)
    assert tree.config()["draft_lookup"] is True and tree.drafter.lookup is not None
    assert tree.run("abc abc abc").stats.new_tokens == 8
    assert Session(DecodingOptions.of(**options, draft_lookup="off"), target=tiny_target).config()["draft_lookup"] is False
    chain = Session(DecodingOptions.of(**{**options, "draft_topk": 1}), target=tiny_target)
    assert chain.config()["draft_lookup"] is True and chain.drafter.chain_lookup is True
    sampled = Session(DecodingOptions.of(**{**options, "draft_topk": 1, "temperature": 1.0}), target=tiny_target)
    assert sampled.config()["draft_lookup"] is False
    ngram = Session(DecodingOptions.of(**{**options, "draft": "ngram"}), target=tiny_target)
    assert ngram.config()["draft_lookup"] is False
    capsys.readouterr()  # the n-gram session's note
    code, out, err = run_cli(capsys, "generate", "abc", "--target", str(tiny_dir), "--device", "cpu",
                             "--draft-lookup", "maybe")
    assert code == 2 and out == ""
    assert err.strip() == "mars: error: --draft-lookup maybe: expected on or off"
