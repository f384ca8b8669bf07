"""Draft-tree units: the shape (ancestry, depths, cuts, first branch), EAGLE-2's tree search, the
n-gram trie, and sampling over a tree keeping the target's distribution."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from mars_cli.decoding.drafters import NgramDrafter
from mars_cli.decoding.sampling import PositionNoise, SamplingParams
from mars_cli.decoding.tree import DraftTree, TreeShape, ancestry, cut_tree, grow_tree, tree_from_paths
from mars_cli.decoding.verifiers import Verifier

from ..trees import path_tokens


def test_grow_tree_keeps_the_best_nodes_closed_under_parents():
    torch.manual_seed(0)
    vocab = 11
    calls = []

    def expand(nodes, tokens, parents):
        calls.append(nodes.numel())
        return torch.log_softmax(torch.randn(nodes.numel(), vocab), dim=-1)

    root = torch.log_softmax(torch.randn(vocab), dim=-1)
    tree = grow_tree(root, expand, topk=3, depth=4, total=10, stop_early=False)
    assert tree.size == 10 and calls == [3, 3, 3]
    parents = tree.parents.tolist()
    assert all(p < i for i, p in enumerate(parents))
    for parent in set(parents):  # siblings are distinct tokens
        siblings = [int(tree.tokens[i]) for i, p in enumerate(parents) if p == parent]
        assert len(siblings) == len(set(siblings))
    # depth first: every node's descendants follow it at once, so the preferred path is a prefix
    sees = tree.ancestry()[1:, 1:]  # node i's row: its ancestors and itself
    for node in range(tree.size):
        below = [i for i in range(tree.size) if i != node and bool(sees[i, node])]
        assert below == list(range(node + 1, node + 1 + len(below)))
    first = tree.first_branch()
    assert tree.tokens[: first.size].tolist() == first.tokens.tolist()
    # topk 1 is a chain
    assert grow_tree(root, expand, topk=1, depth=4, total=4).is_chain()


def test_grow_tree_stops_early_only_where_the_tree_is_already_known():
    """Stopping once no node below the frontier can enter the kept set gives the same tree, with
    fewer drafter steps where the drafter is sure (peaked distributions) and all of them where not."""
    stopped_somewhere = 0
    for seed in range(40):
        generator = torch.Generator().manual_seed(seed)
        sharpness = 1.0 + 9.0 * (seed % 4)  # from flat to peaked: a sure drafter's deep nodes score low

        def expand(nodes, tokens, parents, calls):
            calls.append(nodes.numel())
            return torch.log_softmax(sharpness * torch.randn(nodes.numel(), 13, generator=generator), dim=-1)

        root = torch.log_softmax(sharpness * torch.randn(13, generator=torch.Generator().manual_seed(1000 + seed)), dim=-1)
        state = generator.get_state()
        full_calls, early_calls = [], []
        full = grow_tree(root, lambda *a: expand(*a, full_calls), topk=4, depth=6, total=8, stop_early=False)
        generator.set_state(state)  # the same draws for the levels both searches expand
        early = grow_tree(root, lambda *a: expand(*a, early_calls), topk=4, depth=6, total=8, stop_early=True)
        assert early.tokens.tolist() == full.tokens.tolist() and early.parents.tolist() == full.parents.tolist()
        assert early_calls == full_calls[: len(early_calls)]
        stopped_somewhere += len(early_calls) < len(full_calls)
    assert stopped_somewhere > 0


def test_cut_tree_numbers_depth_first_with_the_best_child_first():
    # a (-0.1) and b (-0.5) under the root; c (-0.3) and d (-0.2) under a; e (-0.9) under b
    tokens, parents = torch.tensor([10, 11, 12, 13, 14]), torch.tensor([-1, -1, 0, 0, 1])
    scores, depths = torch.tensor([-0.1, -0.5, -0.3, -0.2, -0.9]), torch.tensor([1, 1, 2, 2, 2])
    tree = cut_tree(tokens, parents, scores, depths, total=5)
    assert tree.tokens.tolist() == [10, 13, 12, 11, 14]  # a, d, c, b, e
    assert tree.parents.tolist() == [-1, 0, 0, -1, 3]
    cut = cut_tree(tokens, parents, scores, depths, total=3)  # the three best: a, d, c
    assert cut.tokens.tolist() == [10, 13, 12] and cut.parents.tolist() == [-1, 0, 0]


def test_cut_tree_prefers_the_shallower_node_on_ties():
    tokens, parents = torch.tensor([5, 6, 7]), torch.tensor([-1, 0, 1])
    tree = cut_tree(tokens, parents, torch.tensor([0.0, 0.0, 0.0]), torch.tensor([1, 2, 3]), total=2)
    assert tree.tokens.tolist() == [5, 6] and tree.parents.tolist() == [-1, 0]


def test_ngram_drafter_proposes_every_earlier_continuation_as_branches():
    history = torch.tensor([7, 1, 2, 9, 7, 1, 3, 4, 7, 1])
    drafter = NgramDrafter(torch.device("cpu"), TreeShape(3, 8), max_ngram=2, min_ngram=1)
    tree = drafter.propose(history, 3)
    assert not tree.is_chain() and tree.searched == 3
    paths = {tuple(path_tokens(tree, node)) for node in range(tree.size)}
    assert (3, 4, 7) in paths and (2, 9, 7) in paths  # the most recent match, then the earlier one
    assert int(tree.tokens[0]) == 3  # the most recent continuation is the first branch
    chain = NgramDrafter(torch.device("cpu"), max_ngram=2, min_ngram=1).propose(history, 3)
    assert chain.is_chain() and chain.tokens.tolist() == [3, 4, 7]


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
    for draw in range(draws):
        verdict = verifier.verify(logits, tree, PositionNoise(draw, VOCAB))
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
    from mars_cli.decoding.rules import DraftBatch, sampling_choices

    p = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    batch = DraftBatch.of_trees([DraftTree(torch.tensor([0, 1]), torch.tensor([-1, -1]))])
    # uniform 0.55 rejects token 0 (p 0.5); token 1 then has 0.3 / 0.5 = 0.6 > 0.55: accepted
    accepted, strict, residual = sampling_choices(batch, p, torch.tensor([0.55, 0.55]), None, None)
    assert accepted.tolist() == [False, True] and strict.tolist() == [False, True]
    accepted, _, residual = sampling_choices(batch, p, torch.tensor([0.55, 0.65]), None, None)
    assert accepted.tolist() == [False, False]
    # after both were rejected the root's target is the rest: token 2 alone
    torch.testing.assert_close(residual[0], torch.tensor([0.0, 0.0, 1.0]))


def test_a_chain_is_the_one_branch_tree():
    chain = DraftTree.chain(torch.tensor([5, 6, 7, 8]), q=torch.eye(9)[[5, 6, 7, 8]])
    assert chain.is_chain() and chain.depth == 4 and chain.depths().tolist() == [1, 2, 3, 4]
    assert chain.ancestry().equal(torch.ones(5, 5, dtype=torch.bool).tril())
    cut = chain.within_depth(2)
    assert cut.tokens.tolist() == [5, 6] and cut.q.argmax(-1).tolist() == [5, 6]
    assert DraftTree.empty("cpu").is_chain() and DraftTree.empty("cpu").depth == 0


def test_cuts_keep_parents_q_and_the_searched_depth():
    tree = DraftTree(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, -1, 0, 1, 2]), q=torch.eye(10)[[5, 6, 7, 8, 9]],
                     searched=4)
    shallow = tree.within_depth(2)
    assert shallow.tokens.tolist() == [5, 6, 7, 8] and shallow.parents.tolist() == [-1, -1, 0, 1]
    assert shallow.q.argmax(-1).tolist() == [5, 6, 7, 8] and shallow.searched == 4
    branch = tree.first_branch()
    assert branch.is_chain() and branch.tokens.tolist() == [5, 7, 9] and branch.q.argmax(-1).tolist() == [5, 7, 9]
    assert tree.first(3).parents.tolist() == [-1, -1, 0] and tree.first(3).searched == 4
    assert DraftTree(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, -1, 0, 1])).first_branch().tokens.tolist() == [5, 7]


def test_grafted_paths_follow_the_nodes_that_spell_them_and_keep_the_tree_numbered():
    tree = DraftTree(torch.tensor([5, 6, 7]), torch.tensor([-1, -1, 0]), searched=3)  # 5 -> 7, and 6
    grafted = tree.grafted([[5, 7, 9, 9], [6], [8, 1]])
    # the first path follows 5 -> 7 and adds 9 -> 9 below node 2; [6] is there; [8, 1] is a new branch
    assert grafted.tokens.tolist() == [5, 6, 7, 9, 9, 8, 1]
    assert grafted.parents.tolist() == [-1, -1, 0, 2, 3, -1, 5]
    assert grafted.searched == 3 and grafted.depth == 4
    assert path_tokens(grafted, 4) == [5, 7, 9, 9]
    assert tree.grafted([[5, 7], []]) is tree  # nothing new: the same tree
    assert DraftTree.empty("cpu").grafted([[3, 4]]).is_chain()
    with pytest.raises(ValueError):
        DraftTree.chain(torch.tensor([1]), q=torch.eye(3)[[1]]).grafted([[2]])
