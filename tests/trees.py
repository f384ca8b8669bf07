"""Shared by the tree tests: random trees with a planted truth, and a drafter that proposes them."""

from __future__ import annotations

import random

import torch

from mars_cli.decoding.drafters import Drafter
from mars_cli.decoding.loop import DecodeSettings, decode
from mars_cli.decoding.target import TargetScorer
from mars_cli.decoding.tree import DraftTree


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


class RandomTreeDrafter(Drafter):
    """Proposes random trees, with the target's true continuation planted on random branches."""

    name = "random-tree"

    def __init__(self, prompt_len: int, truth: list[int], vocab: int, size: int, seed: int) -> None:
        self.prompt_len, self.truth, self.vocab, self.size = prompt_len, truth, vocab, size
        self.rng = random.Random(seed)

    def propose(self, history: torch.Tensor, k: int) -> DraftTree:
        produced = history.shape[0] - self.prompt_len
        return random_tree(self.rng, self.size, self.vocab, self.truth[produced:])


def decode_all(target, drafter, prompt, max_new, verifier, k=6, tree_tokens=0, noise=None, stats=None,
               static=False):
    tokens: list[int] = []
    scorer = TargetScorer(target, drafter.feature_layers, static_cache=static, headroom=max_new + 70)
    settings = DecodeSettings(max_new, k, tree_tokens=tree_tokens)
    for chunk in decode(scorer, drafter, verifier, prompt, settings, noise, stats):
        tokens.extend(chunk)
    return tokens


