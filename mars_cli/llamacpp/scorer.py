"""The target on llama.cpp, with the contract of decoding/target.TargetScorer: `start` a sequence,
`score` the pending token and a draft chain or tree in one decode, `keep` the rows that stand.

Sequences in llama.cpp's unified cache:
- sequence 0 holds the committed tokens;
- a chain is fed in sequence 0 (row i at position committed + i); `keep` cuts what was not kept;
- a tree gives each of its leaves a sequence of its own (1, 2, ...): the committed cells join every
  leaf's sequence (a copy adds membership, no data moves), the pending token belongs to all of
  them, and each node to the sequences of the leaves below it. llama.cpp masks a row by its first
  sequence, and a node's leaves all lie below it, so every row sees exactly its ancestors: one
  decode scores every branch. `keep` copies the accepted path into sequence 0 and drops the
  leaves' sequences; cells in no sequence are free again.
Lossless needs one more thing: llama.cpp sums attention over cells in cell order, and a batch's
rows take consecutive cells, so an accepted path that is not the tree's first nodes (its cells
interleaved with freed siblings') would have later tokens sum in another order than plain decoding
does. Such a path's cells are freed instead, and its tokens fed again at the head of the next
round's batch (no logits read): every cell then stays in position order, and strict decoding emits
the engine's own plain output token for token (tests_llamacpp/test_lossless.py).
Logits are asked for only where they are read: every scored row, none in the prefill or a re-feed.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..decoding.target import Scored
from ..decoding.tree import DraftTree
from .engine import LlamaEngine

COMMITTED = 0  # the sequence of the committed tokens


class LlamaScorer:
    """The target's forward and cache on llama.cpp for one sequence at a time."""

    feature_layers: tuple[int, ...] = ()  # no hidden states: drafters that read them are refused
    compiled = False
    compiled_widths: frozenset[int] = frozenset()
    kind = "llama.cpp"

    def __init__(self, target, engine: LlamaEngine) -> None:
        self.target = target
        self.engine = engine
        self.max_length = engine.length
        self.committed = 0
        self.threads = engine.settings.thread_count()
        self._branches = 0  # the leaf sequences of the last tree fed (1..branches), 0 for a chain
        self._leaf_of: list[int] = []
        self._fed: list[int] = []  # the tokens of the last scored rows (pending first)
        self._refeed: list[int] = []  # committed tokens with no cell: fed at the head of the next batch

    def start(self, context: torch.Tensor, room: int | None = None) -> None:
        """A new sequence: the cache emptied, then `context` fed (no logits kept)."""
        self.engine.clear()
        self.committed = 0
        self._branches = 0
        self._refeed = []
        ids = [int(token) for token in context.tolist()]
        step = self.engine.settings.batch
        for start in range(0, len(ids), step):
            chunk = ids[start : start + step]
            self.engine.decode(chunk, range(start, start + len(chunk)), [(COMMITTED,)] * len(chunk),
                               [False] * len(chunk))
        self.committed = len(ids)
        return None

    def score(self, pending: torch.Tensor, tree: DraftTree, width: int, features: bool = True) -> Scored:
        """Feed `pending` and the tree's nodes after the committed cells; logits of every row.
        No padding: llama.cpp has no compiled widths, and a wider batch only costs more."""
        past, refeed = self.committed, self._refeed
        tokens = [int(pending[0])] + [int(token) for token in tree.tokens.tolist()]
        self._fed = tokens
        if tree.is_chain():
            self._branches = 0
            positions = list(range(past, past + len(tokens)))
            members = [(COMMITTED,)] * len(tokens)
        else:
            positions, members = self._tree_rows(tree, past, cached=past - len(refeed))
        before = range(past - len(refeed), past)
        logits = self.engine.decode(refeed + tokens, [*before, *positions], [members[0]] * len(refeed) + members,
                                    [False] * len(refeed) + [True] * len(tokens))
        self._refeed = []
        return Scored(torch.from_numpy(logits), None, len(refeed) + len(tokens))

    def _tree_rows(self, tree: DraftTree, past: int, cached: int) -> tuple[list[int], list[tuple[int, ...]]]:
        """Positions and sequence sets of a tree's rows (the pending token first), its leaves
        numbered 1, 2, ... in node order; the `cached` committed cells joined to every leaf's sequence."""
        parents = tree.parents.tolist()
        size = len(parents)
        children = [0] * size
        for parent in parents:
            if parent >= 0:
                children[parent] += 1
        leaves = [node for node in range(size) if children[node] == 0]
        below: list[set[int]] = [set() for _ in range(size)]
        for number, leaf in enumerate(leaves, start=1):
            node = leaf
            while node >= 0:
                below[node].add(number)
                node = parents[node]
        self._branches = len(leaves)
        self._leaf_of = [min(found) for found in below]  # a leaf's sequence under each node
        for number in range(1, len(leaves) + 1):
            self.engine.remove(number)  # nothing of an earlier round's leaves stays
            if cached:
                self.engine.copy(COMMITTED, number, 0, cached)
        depths = tree.depths().tolist()
        positions = [past] + [past + depth for depth in depths]
        everyone = tuple(range(0, len(leaves) + 1))
        return positions, [everyone] + [tuple(sorted(found)) for found in below]

    def keep(self, rows: Sequence[int] | torch.Tensor) -> None:
        """Keep the fed rows `rows` (row 0, the pending token, first; then the accepted path)."""
        rows = [int(row) for row in rows]
        kept_end = self.committed + len(rows)
        spare = len(rows) < len(self._fed) or self._branches > 0  # cells past the kept ones to drop
        if self._branches:
            in_order = rows == list(range(len(rows)))  # the tree's first nodes: their cells follow the pending one's
            if len(rows) > 1 and in_order:  # the path lies in the sequence of a leaf below its last node
                leaf = self._leaf_of[rows[-1] - 1]
                self.engine.copy(leaf, COMMITTED, self.committed + 1, kept_end)
            for number in range(1, self._branches + 1):
                self.engine.remove(number)
            self._branches = 0
            if not in_order:  # its cells are gone with the leaves' sequences: fed again, in order, next round
                self._refeed = [self._fed[row] for row in rows[1:]]
        if spare:  # a plain round or a wholly accepted chain leaves none: no call
            self.engine.remove(COMMITTED, kept_end - len(self._refeed), -1)
        self.committed = kept_end
        return None

    def rewind(self, length: int) -> None:
        """Forget everything after the first `length` committed positions."""
        for number in range(1, self._branches + 1):
            self.engine.remove(number)
        self._branches = 0
        cached = self.committed - len(self._refeed)
        self._refeed = self._refeed[: max(0, length - cached)]
        self.engine.remove(COMMITTED, length, -1)
        self.committed = min(self.committed, length)

    def set_threads(self, threads: int) -> None:
        """Decode with `threads` threads from now on (tuning/threads.py measures which count)."""
        self.engine.set_threads(threads)
        self.threads = threads

    def engine_key(self) -> dict:
        """What this engine's forward costs depend on beyond the machine, model and weight type
        (tuning/curve.py keys the cost curve's cache entry with it)."""
        return {"engine": "llama.cpp", "binding": _binding_version(self.engine), "threads": self.threads}

    def tree_fits(self, width: int) -> bool:
        return True  # llama.cpp masks by sequence and position, sliding-window layers included


def _binding_version(engine: LlamaEngine) -> str:
    return str(getattr(engine.lib, "__version__", None) or _package_version())


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return "unknown"
