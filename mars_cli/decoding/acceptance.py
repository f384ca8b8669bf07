"""What a drafter is expected to get accepted: the figures the cost model weighs a draft shape by.

A round's worth depends on two things: what its verification forward costs on this machine (the
measured cost curve, cost.py) and how many tokens it emits, which is the drafter's own property.
A draft head carries its measured figures in its config.json (`mars.acceptance`, written when it
is shipped, from held-out suites), so that a better head, or a user's own, is weighed by what it
does; a drafter without figures is weighed by EARLY_HEAD, an early SmolLM2 head's. The figures
decide chain against tree and the tree's size (`cost.tree_shape`), and a drafting session's dtype
(`cost.speculative_estimate`), never a draft's length, which each session learns from its rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UserError

MAX_CHAIN_POSITIONS = 16
MIN_TREE_SIZE, MAX_TREE_SIZE = 2, 64


@dataclass(frozen=True)
class DraftAcceptance:
    """`chain`: P(chain position i accepted | every position before it was), for a chain of
    len(chain) drafts; `tree_tau`: tokens a round emits, by tree size (nodes), for trees of
    TREE_TOPK children a node searched as `--num-draft auto` searches them; `source`: where the
    figures came from, for notes and the dtype cache's key."""

    chain: tuple[float, ...]
    tree_tau: dict[int, float]
    source: str

    def tree(self, size: int) -> float:
        """The tokens a round of a `size`-node tree emits: interpolated in log2(size) between
        measured sizes; below the smallest its figure, past the largest no further gain (a larger
        tree must be as cheap to verify to be chosen)."""
        sizes = sorted(self.tree_tau)
        if size <= sizes[0]:
            return self.tree_tau[sizes[0]]
        for small, large in zip(sizes, sizes[1:]):
            if size <= large:
                share = (math.log2(size) - math.log2(small)) / (math.log2(large) - math.log2(small))
                return self.tree_tau[small] + share * (self.tree_tau[large] - self.tree_tau[small])
        return self.tree_tau[sizes[-1]]

    def key(self) -> dict:
        """The figures as a cache key's part (a dtype measured with other figures is stale)."""
        return {"chain": [round(p, 4) for p in self.chain],
                "tree_tau": {str(n): round(t, 4) for n, t in sorted(self.tree_tau.items())}}

    @classmethod
    def from_json(cls, data: object, where: str, source: str) -> "DraftAcceptance":
        """A config.json entry `{"chain": [p, ...], "tree_tau": {"8": tau, ...}}`, each figure in
        its range, else one line naming `where` and the field."""
        if not isinstance(data, dict):
            raise UserError(f"{where}: expected an object with `chain` and `tree_tau`, got {data!r:.60}")
        chain = data.get("chain")
        if (not isinstance(chain, list) or not 1 <= len(chain) <= MAX_CHAIN_POSITIONS
                or not all(_number(p) and 0.0 <= p <= 1.0 for p in chain)):
            raise UserError(f"{where}: `chain` must be 1-{MAX_CHAIN_POSITIONS} probabilities between 0 and 1, "
                            f"got {chain!r:.60}")
        trees = data.get("tree_tau")
        if not isinstance(trees, dict) or not trees:
            raise UserError(f"{where}: `tree_tau` must map tree sizes to tokens a round, got {trees!r:.60}")
        tree_tau = {}
        for size, tau in trees.items():
            nodes = int(size) if isinstance(size, str) and size.isdigit() else None
            if nodes is None or not MIN_TREE_SIZE <= nodes <= MAX_TREE_SIZE:
                raise UserError(f"{where}: `tree_tau` sizes must be whole numbers {MIN_TREE_SIZE}-{MAX_TREE_SIZE}, "
                                f"got {size!r:.30}")
            if not _number(tau) or not 1.0 <= tau <= nodes + 1:
                raise UserError(f"{where}: `tree_tau` for {nodes} nodes must be between 1 and {nodes + 1} tokens "
                                f"a round, got {tau!r:.30}")
            tree_tau[nodes] = float(tau)
        return cls(tuple(float(p) for p in chain), tree_tau, source)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# An early SmolLM2 head's figures (bfloat16, held-out chat and code suites; docs/benchmarks.md,
# "Tree shapes"): k = 4 chains 0.52 0.50 0.48 0.41, trees of 8 / 16 / 32 nodes 2.14 / 2.37 / 2.48.
# They stand in for a drafter that carries none (a head without `mars.acceptance`, a draft model,
# prompt lookup).
EARLY_HEAD = DraftAcceptance(chain=(0.52, 0.50, 0.48, 0.41), tree_tau={8: 2.14, 16: 2.37, 32: 2.48},
                             source="an early SmolLM2 head's figures")
