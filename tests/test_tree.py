"""Draft trees: one target pass scores every branch as sequential decoding would, verification
over trees is lossless (greedy: the target's own output; sampling: its distribution), and the
cache after an accepted side branch equals a fresh forward over the accepted tokens."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mars_cli.decoding.drafters import Draft, Drafter, NgramDrafter
from mars_cli.decoding.kv import StaticKVCache
from mars_cli.decoding.loop import DecodeSettings, decode
from mars_cli.decoding.sampling import SamplingParams
from mars_cli.decoding.stats import DecodeStats
from mars_cli.decoding.target import TargetScorer
from mars_cli.decoding.tree import DraftTree, ancestry, cut_tree, grow_tree, tree_from_paths
from mars_cli.decoding.verifiers import Verifier, tree_sampling_accepts
from mars_cli.head.drafter import HeadDrafter
from mars_cli.models import load_model

from .test_head import random_head
from .test_loop import hf_greedy, random_prompt


def random_tree(rng: random.Random, size: int, vocab: int, truth: list[int] | None = None) -> DraftTree:
    """A random tree of `size` nodes with distinct sibling tokens; with `truth`, the true
    continuation is planted along some branch, not necessarily the first."""
    parents, tokens, children = [], [], {-1: []}
    for node in range(size):
        parent = rng.choice([-1] + list(range(node)))
        used = {tokens[c] for c in children[parent]}
        choices = [t for t in range(3, vocab) if t not in used]
        depth = 0 if parent < 0 else _depth(parents, parent) + 1
        want = truth[depth] if truth is not None and depth < len(truth) and rng.random() < 0.5 else None
        token = want if want is not None and want not in used else rng.choice(choices)
        parents.append(parent)
        tokens.append(token)
        children[parent].append(node)
        children[node] = []
    return DraftTree(torch.tensor(tokens), torch.tensor(parents))


def _depth(parents: list[int], node: int) -> int:
    depth = 0
    while parents[node] >= 0:
        node, depth = parents[node], depth + 1
    return depth


def path_tokens(tree: DraftTree, node: int) -> list[int]:
    path, parents = [], tree.parents.tolist()
    while node >= 0:
        path.append(int(tree.tokens[node]))
        node = parents[node]
    return path[::-1]


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
    logits = scorer.score(torch.tensor(prompt[-1:]), tree.tokens, width=12, tree=tree).logits
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
    logits = scorer.score(torch.tensor(prompt[-1:]), tree.tokens, width=6, tree=tree).logits
    verdict = Verifier("strict").verify(logits, tree.tokens, None, None, tree)
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
    next_logits = scorer.score(torch.tensor([verdict.next_token]), torch.empty(0, dtype=torch.long), width=1).logits
    with torch.no_grad():
        expected = tiny_target.model(torch.tensor([accepted + [verdict.next_token]])).logits[0, -1]
    torch.testing.assert_close(next_logits[0], expected, atol=1e-4, rtol=1e-4)


class RandomTreeDrafter(Drafter):
    """Proposes random trees, with the target's true continuation planted on random branches."""

    name = "random-tree"

    def __init__(self, prompt_len: int, truth: list[int], vocab: int, size: int, seed: int) -> None:
        self.prompt_len, self.truth, self.vocab, self.size = prompt_len, truth, vocab, size
        self.rng = random.Random(seed)

    def propose(self, history: torch.Tensor, k: int) -> Draft:
        produced = history.shape[0] - self.prompt_len
        tree = random_tree(self.rng, self.size, self.vocab, self.truth[produced:])
        return Draft(tree.tokens, None, tree)


def decode_all(target, drafter, prompt, max_new, verifier, k=6, tree_tokens=0, generator=None, stats=None):
    tokens: list[int] = []
    scorer = TargetScorer(target, drafter.feature_layers)
    settings = DecodeSettings(max_new, k, tree_tokens=tree_tokens)
    for chunk in decode(scorer, drafter, verifier, prompt, settings, generator, stats):
        tokens.extend(chunk)
    return tokens


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
        drafters = [HeadDrafter(head, tiny_target, SamplingParams(0.0), None, tree_topk=topk, tree_tokens=tokens),
                    NgramDrafter(tiny_target.device, 3, 1, tree_topk=topk, tree_tokens=tokens)]
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


def test_grow_tree_keeps_the_best_nodes_closed_under_parents():
    torch.manual_seed(0)
    vocab = 11
    calls = []

    def expand(nodes, tokens, parents):
        calls.append(nodes.numel())
        return torch.log_softmax(torch.randn(nodes.numel(), vocab), dim=-1)

    root = torch.log_softmax(torch.randn(vocab), dim=-1)
    tree = grow_tree(root, expand, topk=3, depth=4, total=10)
    assert tree.size == 10 and calls == [3, 3, 3]
    parents = tree.parents.tolist()
    assert all(p < i for i, p in enumerate(parents))
    for parent in set(parents):  # siblings are distinct tokens
        siblings = [int(tree.tokens[i]) for i, p in enumerate(parents) if p == parent]
        assert len(siblings) == len(set(siblings))
    assert tree.depths().tolist() == sorted(tree.depths().tolist())
    # topk 1 is a chain
    assert grow_tree(root, expand, topk=1, depth=4, total=4).is_chain()


def test_cut_tree_prefers_the_shallower_node_on_ties():
    tokens, parents = torch.tensor([5, 6, 7]), torch.tensor([-1, 0, 1])
    tree = cut_tree(tokens, parents, torch.tensor([0.0, 0.0, 0.0]), torch.tensor([1, 2, 3]), total=2)
    assert tree.tokens.tolist() == [5, 6] and tree.parents.tolist() == [-1, 0]


def test_ngram_drafter_proposes_every_earlier_continuation_as_branches():
    history = torch.tensor([7, 1, 2, 9, 7, 1, 3, 4, 7, 1])
    drafter = NgramDrafter(torch.device("cpu"), 2, 1, tree_topk=3, tree_tokens=8)
    draft = drafter.propose(history, 3)
    assert draft.tree is not None
    paths = {tuple(path_tokens(draft.tree, node)) for node in range(draft.tree.size)}
    assert (3, 4, 7) in paths and (2, 9, 7) in paths  # the most recent match, then the earlier one
    assert int(draft.tree.tokens[0]) == 3  # the most recent continuation is the first branch
    chain = NgramDrafter(torch.device("cpu"), 2, 1).propose(history, 3)
    assert chain.tree is None and chain.tokens.tolist() == [3, 4, 7]


def test_tree_from_paths_merges_shared_prefixes_and_cuts_breadth_first():
    tree = tree_from_paths([[1, 2, 3], [1, 4], [5]], total=4, device=torch.device("cpu"))
    assert tree.tokens.tolist() == [1, 5, 2, 4] and tree.parents.tolist() == [-1, -1, 0, 0]


def test_ancestry_sees_ancestors_only():
    sees = ancestry(torch.tensor([-1, -1, 0, 2]), width=6)
    assert sees[4].tolist() == [True, True, False, True, True, False]  # node 3: root, 0, 2, itself
    assert sees[5].tolist() == [True, False, False, False, False, True]  # padding: root and itself


# --------------------------------------------------------------------------- sampling on trees
VOCAB = 4


def _oracle(seed: int):
    """A 'target' over a 4-token vocabulary: p(. | prefix) for every prefix up to two tokens."""
    generator = torch.Generator().manual_seed(seed)
    table = {}
    for first in [None, *range(VOCAB)]:
        key = () if first is None else (first,)
        table[key] = torch.randn(VOCAB, generator=generator) * 1.5
    return table


@pytest.mark.parametrize("rule", ["strict", "mars"])
def test_sampling_on_a_tree_keeps_the_target_distribution(rule):
    """Two tokens from one round (the second from the target when the round emits one): their
    joint frequency over many rounds matches p(x1) p(x2 | x1) within sampling noise. MARS with
    theta 1.0 relaxes nothing, so it must match too."""
    table = _oracle(0)
    # root children: tokens 2, 0, 3 (token 1 is not drafted); node 0 (token 2) has children 1 and 2
    tree = DraftTree(torch.tensor([2, 0, 3, 1, 2]), torch.tensor([-1, -1, -1, 0, 0]))
    rows = [(), (2,), (0,), (3,), (2, 1), (2, 2)]
    logits = torch.stack([table[r] if len(r) < 2 else torch.zeros(VOCAB) for r in rows])
    verifier = Verifier(rule, threshold=1.0, sampling=SamplingParams(temperature=1.0))
    generator = torch.Generator().manual_seed(1)
    draws = 8_000
    counts: Counter = Counter()
    for _ in range(draws):
        verdict = verifier.verify(logits, tree.tokens, None, generator, tree)
        emitted = [int(tree.tokens[i]) for i in verdict.accepted_positions] + [verdict.next_token]
        if len(emitted) == 1:
            p = torch.softmax(table[(emitted[0],)], dim=-1)
            emitted.append(int(torch.multinomial(p, 1, generator=generator)))
        counts[tuple(emitted[:2])] += 1
    p1 = torch.softmax(table[()], dim=-1)
    total_variation = 0.0
    for a in range(VOCAB):
        p2 = torch.softmax(table[(a,)], dim=-1)
        for b in range(VOCAB):
            total_variation += abs(counts[(a, b)] / draws - float(p1[a] * p2[b]))
    assert total_variation / 2 < 0.03  # about 0.015 expected from sampling noise alone


def test_a_childs_chance_is_the_target_mass_left_by_its_earlier_siblings():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    tokens, parents = torch.tensor([0, 1]), torch.tensor([-1, -1])
    # uniform 0.55 rejects token 0 (p 0.5); token 1 then has 0.3 / 0.5 = 0.6 > 0.55: accepted
    chosen, strict = tree_sampling_accepts(p, tokens, parents, torch.tensor([0.55, 0.55]), None, None)
    assert chosen.tolist() == [False, True] and strict.tolist() == [False, True]
    chosen, _ = tree_sampling_accepts(p, tokens, parents, torch.tensor([0.55, 0.65]), None, None)
    assert chosen.tolist() == [False, False]


@pytest.mark.parametrize("seed", range(3))
def test_draft_model_trees_reproduce_the_target(tiny_target, tiny_draft, seed):
    from mars_cli.decoding.drafters import ModelDrafter

    rng = random.Random(seed)
    vocab = len(tiny_target.tokenizer)
    prompt = random_prompt(rng, vocab, 15)
    expected = hf_greedy(tiny_target, prompt, 30)
    for topk, tokens in ((2, 6), (4, 16)):
        drafter = ModelDrafter(tiny_draft, SamplingParams(0.0), None, tree_topk=topk, tree_tokens=tokens)
        stats = DecodeStats()
        assert decode_all(tiny_target, drafter, prompt, 30, Verifier("strict"), 4, tokens, stats=stats) == expected
        assert stats.tree_rounds > 0


def test_draft_model_tree_drafts_what_its_chain_drafts_first(tiny_draft):
    """The first branch of a draft model's tree at top-k 1 is its greedy chain, computed with the
    tree's mask and positions: the tree search and the masked forwards agree with plain drafting."""
    from mars_cli.decoding.drafters import ModelDrafter

    history = torch.tensor(random_prompt(random.Random(1), len(tiny_draft.tokenizer), 11))
    chain = ModelDrafter(tiny_draft, SamplingParams(0.0), None).propose(history, 5)
    tree_drafter = ModelDrafter(tiny_draft, SamplingParams(0.0), None, tree_topk=3, tree_tokens=15)
    tree = tree_drafter.propose(history, 5).tree
    node, path, parents = 0, [], tree.parents.tolist()
    while True:  # follow the best child (the first, by score) from the root down
        path.append(int(tree.tokens[node]))
        children = [i for i, p in enumerate(parents) if p == node]
        if not children:
            break
        node = children[0]
    assert path == chain.tokens.tolist()[: len(path)] and len(path) >= 3
    assert len(tree_drafter.cache) == history.numel()  # the drafted rows left its cache


@pytest.mark.parametrize("args, message", [
    (["--draft-topk", "0"], "--draft-topk must be 'auto' or between 1 and 16"),
    (["--draft-topk", "17"], "--draft-topk must be 'auto' or between 1 and 16"),
    (["--draft-topk", "wide"], "--draft-topk must be 'auto' or between 1 and 16"),
    (["--draft-tokens", "0"], "--draft-tokens must be 'auto' or between 1 and 64"),
    (["--draft-tokens", "65"], "--draft-tokens must be 'auto' or between 1 and 64"),
])
def test_bad_tree_flags_are_one_line(capsys, tiny_dir, args, message):
    from mars_cli.cli import main

    code = main(["generate", "hello", "--target", str(tiny_dir), "--device", "cpu", "--draft", "ngram", "-n", "4", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_tree_wider_than_the_context_window_is_one_line(capsys, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from mars_cli.cli import main

    from .conftest import build_tokenizer

    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    capsys.readouterr()  # transformers' own progress bar while saving
    code = main(["generate", "hi", "--target", str(tmp_path), "--device", "cpu", "--draft", "ngram", "-n", "4",
                 "--raw", "--draft-topk", "4", "--draft-tokens", "48"])
    err = capsys.readouterr().err
    assert code == 2 and "--draft-tokens 48" in err and "context" in err
    assert len([line for line in err.strip().splitlines() if not line.startswith("mars: note")]) == 1


def test_generate_shows_the_tree_it_drafted(capsys, tiny_dir):
    import json

    from mars_cli.cli import main

    code = main(["generate", "abcabcabcabc", "--target", str(tiny_dir), "--device", "cpu", "--draft", "ngram",
                 "--raw", "-n", "12", "--num-draft", "3", "--draft-topk", "3", "--draft-tokens", "6", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["config"]["tree_topk"] == 3 and report["config"]["tree_tokens"] == 6
    assert report["stats"]["accepted_length_histogram"]


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
    assert tokens == expected and scorer.kind == "compiled" and scorer._widths <= {1, 7}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 6), rule=st.sampled_from(["strict", "mars"]),
       threshold=st.sampled_from([0.5, 0.9, 0.99, 1.0]))
def test_greedy_rules_on_a_chain_shaped_tree_equal_the_chain_rules(seed, k, rule, threshold):
    """A chain is the tree whose node i has parent i - 1: the tree rules must decide exactly as the
    chain rules do (accepted drafts, next token, relaxed and low-margin counts)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = 6
    logits = torch.randn(k + 1, vocab, generator=generator) * 2 + 1
    drafts = torch.where(torch.rand(k, generator=generator) < 0.5, logits[:k].argmax(-1),
                         torch.randint(0, vocab, (k,), generator=generator))
    # runner-ups too, so MARS has something to relax
    drafts = torch.where(torch.rand(k, generator=generator) < 0.3, logits[:k].topk(2).indices[:, 1], drafts)
    verifier = Verifier(rule, threshold=threshold)
    chain = verifier.verify(logits, drafts)
    tree = verifier.verify(logits, drafts, None, None, DraftTree.chain(drafts))
    assert (tree.accepted_positions, tree.next_token, tree.relaxed, tree.low_margin) == \
        (chain.accepted_positions, chain.next_token, chain.relaxed, chain.low_margin)
    assert tree.examined == chain.examined


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
    assert DraftTree(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, -1, 0, 1])).first_branch().tolist() == [5, 7]


def test_sampled_decoding_with_draft_model_trees_follows_the_target(tiny_target, tiny_draft):
    """End to end through the loop, sampling at T = 1 with draft-model trees (top-3, 8 nodes): the
    first generated token, an accepted child of the root or the correction drawn after all were
    rejected, follows the target's distribution."""
    from mars_cli.decoding.drafters import ModelDrafter
    from mars_cli.decoding.loop import make_generator

    from .test_loop import assert_follows

    sampling = SamplingParams(1.0)
    prompt = [5, 6, 7]
    with torch.no_grad():
        p_first = torch.softmax(tiny_target.model(torch.tensor([prompt])).logits[0, -1].float(), -1)
    draws, counts = 1200, torch.zeros_like(p_first)
    generator = make_generator(tiny_target.device, 0)
    verifier = Verifier("strict", sampling=sampling)
    drafter = ModelDrafter(tiny_draft, sampling, None, tree_topk=3, tree_tokens=8)
    stats = DecodeStats()
    for _ in range(draws):
        first = decode_all(tiny_target, drafter, prompt, 2, verifier, 3, 8, generator, stats)[0]
        counts[first] += 1
    assert_follows(counts, p_first, draws)
    assert stats.tree_rounds > 0
