"""Draft trees: several candidates per position, verified by the target in one forward.

A tree's nodes are numbered in topological order (a parent before its children); `parents[i]` is
node i's parent, -1 for a child of the root. The root is the pending token (the last emitted one,
not yet in the target's cache), fed at row 0; node i is fed at row i + 1, like a chain's drafts,
so a chain is the tree whose node i has parent i - 1. Siblings hold distinct tokens, in the
drafter's order of preference (verification tries them in that order).

What one target pass over a tree needs is here: which fed rows may see which (`ancestry`), the
float additive mask that says so, and each row's position (the root's position plus its depth).
`grow_tree` is EAGLE-2's dynamic tree search, shared by every drafter with a distribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class TreeShape:
    """A drafter's shape, fixed when it is built: children per node (1: a chain) and nodes per
    tree (0 for a chain: as many as the round's depth)."""

    topk: int = 1
    tokens: int = 0

    @property
    def branches(self) -> bool:
        return self.topk > 1


CHAIN = TreeShape()


@dataclass
class DraftTree:
    """What every drafter proposes. Node tokens [n] (long, on the drafter's device), parents [n]
    (long, on the CPU: the shape is bookkeeping, read without device round trips; `parents[i] <
    i`), and optionally `q` [n, V]: the distribution each node was drawn from given its earlier
    siblings (None: the proposals are taken as given, a one-hot q). `searched`: the levels the
    drafter spent growing it, when not its depth (a tree search's time belongs to the levels it
    searched, whatever depth its best nodes reached)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    q: torch.Tensor | None = None
    searched: int | None = None

    def __post_init__(self) -> None:
        self.parents = self.parents.cpu()
        self._ancestry: torch.Tensor | None = None
        self._is_chain: bool | None = None

    @classmethod
    def chain(cls, tokens: torch.Tensor, q: torch.Tensor | None = None) -> "DraftTree":
        """Node i is the child of node i - 1: a chain is the one-branch tree."""
        return cls(tokens, torch.arange(-1, tokens.numel() - 1), q)

    @classmethod
    def empty(cls, device: torch.device | str) -> "DraftTree":
        """No proposal: the round is a plain step of the target."""
        return cls.chain(torch.empty(0, dtype=torch.long, device=device))

    def ancestry(self, width: int | None = None) -> torch.Tensor:
        """[W, W] bool on the CPU, W = `width` or n + 1 (see `ancestry`); the tree's own rows are
        computed once, padding rows added around them."""
        if self._ancestry is None:
            self._ancestry = ancestry(self.parents)
        return _pad_rows(self._ancestry, width)

    def positions(self, past: int, width: int | None = None) -> torch.Tensor:
        """Position ids [1, W]: the root at `past`, every node at `past` + its depth; padding
        rows at `past` + 1 (they are scored and dropped)."""
        depth = torch.ones(width or self.size + 1, dtype=torch.long)
        depth[0] = 0
        depth[1 : self.size + 1] = self.depths()
        return (past + depth)[None]

    @property
    def size(self) -> int:
        return self.tokens.numel()

    def depths(self) -> torch.Tensor:
        """Depth of every node (a child of the root has depth 1), [n] long: its ancestors and
        itself, below the root."""
        if self.is_chain():
            return torch.arange(1, self.size + 1)
        return self.ancestry()[1:, 1:].sum(dim=-1)

    @property
    def depth(self) -> int:
        if self.is_chain():
            return self.size
        return int(self.depths().max()) if self.size else 0

    def is_chain(self) -> bool:
        """Every node the only child of the one before it (an empty tree is a chain too)."""
        if self._is_chain is None:
            self._is_chain = bool((self.parents == torch.arange(-1, self.size - 1)).all())
        return self._is_chain

    def select(self, nodes: torch.Tensor) -> "DraftTree":
        """The nodes `nodes` (ascending CPU indices, closed under parents), renumbered."""
        renumber = torch.full((self.size,), -1, dtype=torch.long)
        renumber[nodes] = torch.arange(nodes.numel())
        parents = self.parents[nodes]
        return DraftTree(self.tokens[nodes.to(self.tokens.device)],
                         torch.where(parents < 0, parents, renumber[parents.clamp_min(0)]),
                         None if self.q is None else self.q[nodes.to(self.q.device)], self.searched)

    def within_depth(self, max_depth: int) -> "DraftTree":
        """The nodes at most `max_depth` deep, renumbered (still in topological order)."""
        if self.depth <= max_depth:
            return self
        if self.is_chain():
            return self.first(max_depth)
        return self.select(torch.nonzero(self.depths() <= max_depth)[:, 0])

    def first(self, count: int) -> "DraftTree":
        """The first `count` nodes: still a tree, as parents come before their children."""
        if count >= self.size:
            return self
        return DraftTree(self.tokens[:count], self.parents[:count], None if self.q is None else self.q[:count],
                         self.searched)

    def grafted(self, paths: list[list[int]]) -> "DraftTree":
        """This tree with token paths from the root grafted on as a trie: a path follows the nodes
        that already spell it and adds the rest as new nodes numbered after the tree's own, so those
        keep their numbers (the preferred path stays nodes 0, 1, 2, ...) and siblings stay distinct.
        Only for proposals taken as given (no q): a grafted node has no draft distribution. Reads
        the tree's tokens on the host (on a GPU, one small copy)."""
        if self.q is not None:
            raise ValueError("grafted: a tree with draft distributions takes no extra paths")
        tokens, parents = self.tokens.tolist(), self.parents.tolist()
        child = {(parent, token): node for node, (token, parent) in enumerate(zip(tokens, parents))}
        for path in paths:
            node = -1
            for token in path:
                if (node, token) not in child:
                    child[(node, token)] = len(tokens)
                    tokens.append(token)
                    parents.append(node)
                node = child[(node, token)]
        if len(tokens) == self.size:
            return self
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=self.tokens.device),
                         torch.tensor(parents, dtype=torch.long), None, self.searched)

    def first_branch(self) -> "DraftTree":
        """The chain along each node's first child from the root: the drafter's preferred path,
        what a chain would have drafted."""
        if self.is_chain():
            return self
        parents, path, node = self.parents.tolist(), [], -1
        while (child := next((i for i, parent in enumerate(parents) if parent == node), None)) is not None:
            path.append(child)
            node = child
        return self.select(torch.tensor(path, dtype=torch.long))


def ancestry(parents: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """Which fed rows each row may attend to ([W, W] bool, W = `width` or n + 1): row r sees
    itself and its ancestors up to the root (row 0). Rows past the tree (padding) see the root
    and themselves only."""
    sees = torch.eye(parents.numel() + 1, dtype=torch.bool)
    sees[:, 0] = True
    for node, parent in enumerate(parents.tolist()):  # parents come first: their rows are complete
        sees[node + 1] |= sees[parent + 1]
    return _pad_rows(sees, width)


def _pad_rows(sees: torch.Tensor, width: int | None) -> torch.Tensor:
    """`sees` with padding rows up to `width`, each seeing the root and itself."""
    if width is None or width <= sees.shape[0]:
        return sees
    padded = torch.eye(width, dtype=torch.bool)
    padded[:, 0] = True
    padded[: sees.shape[0], : sees.shape[0]] = sees
    return padded


def attention_bias(sees: torch.Tensor, past: int, kv_length: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask [1, 1, W, kv_length] in `dtype` for rows fed after `past` cached
    positions, which see the whole prefix and, among the fed rows, what `sees` allows. transformers
    takes a 4D mask as given; a float one is right for every attention implementation (eager
    attention adds a boolean mask as 0/1 and silently attends everywhere). Columns past the fed
    rows (a static cache's unused capacity) are masked."""
    width = sees.shape[0]
    visible = torch.zeros(width, kv_length, dtype=torch.bool, device=sees.device)
    visible[:, :past] = True
    visible[:, past : past + width] = sees
    return bias_from_visibility(visible, dtype)


def bias_from_visibility(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[rows, columns] bool -> the float additive mask [1, 1, rows, columns]: 0 where visible,
    the dtype's minimum elsewhere."""
    bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return bias.masked_fill(~visible, torch.finfo(dtype).min)[None, None]


# --------------------------------------------------------------------------- dynamic tree search
# expand(nodes, tokens, parents) -> log-probabilities [m, V'] of the children of each frontier
# node (ids in the search's pool, their tokens, their parents' pool ids, -1 for the root); the
# drafter runs its model over the frontier, each node seeing only its own ancestors, to answer.
Expand = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def grow_tree(root_logprobs: torch.Tensor, expand: Expand, topk: int, depth: int, total: int,
              stop_early: bool | None = None) -> DraftTree:
    """EAGLE-2's dynamic tree over the drafter's rows (token ids are mapped by the caller).

    Depth 1: the `topk` best children of the root. Each further depth expands the `topk` best
    nodes of the previous depth (by cumulative log-probability, the drafter's estimate that the
    target accepts the whole path), `topk` children each. The tree kept is the `total` best nodes
    of everything scored (EAGLE-2's rerank); a parent scores at least as well as its children, and
    ties go to the shallower node, so the kept set is closed under parents. `expand` is called
    at most depth - 1 times, on at most `topk` nodes each: `stop_early` (default: on the CPU, where
    reading a score costs no device sync) ends the search once no node below the frontier can
    enter the kept `total` (the same tree, fewer drafter steps: `_settled`)."""
    if stop_early is None:
        stop_early = root_logprobs.device.type == "cpu"
    topk = max(1, min(topk, root_logprobs.shape[-1]))
    scores, tokens = root_logprobs.topk(topk)
    device = root_logprobs.device
    pool_tokens, pool_parents, pool_scores, pool_depths = [tokens], [torch.full((topk,), -1, device=device)], [scores], [1]
    frontier = torch.arange(topk, device=device)  # pool indices of the nodes to expand next
    frontier_scores = scores
    offset = topk
    for level in range(2, depth + 1):
        if stop_early and _settled(frontier_scores, pool_scores, total):
            break
        frontier_tokens, frontier_parents = torch.cat(pool_tokens)[frontier], torch.cat(pool_parents)[frontier]
        logprobs = expand(frontier, frontier_tokens, frontier_parents)  # [m, V']
        child_scores, child_tokens = logprobs.topk(topk, dim=-1)
        child_scores = child_scores + frontier_scores[:, None]
        child_parents = frontier[:, None].expand_as(child_tokens)
        pool_tokens.append(child_tokens.reshape(-1))
        pool_parents.append(child_parents.reshape(-1))
        pool_scores.append(child_scores.reshape(-1))
        pool_depths.append(level)
        best = child_scores.reshape(-1).topk(min(topk, child_scores.numel())).indices
        frontier = offset + best
        frontier_scores = child_scores.reshape(-1)[best]
        offset += child_tokens.numel()
    all_tokens, all_parents, all_scores = torch.cat(pool_tokens), torch.cat(pool_parents), torch.cat(pool_scores)
    all_depths = torch.cat([torch.full((t.numel(),), d, device=device) for t, d in zip(pool_tokens, pool_depths)])
    return cut_tree(all_tokens, all_parents, all_scores, all_depths, total)


def _settled(frontier_scores: torch.Tensor, pool_scores: list[torch.Tensor], total: int) -> bool:
    """Whether the `total` best nodes are already known: a child scores at most its parent (a
    log-probability is at most 0) and loses a tie to the shallower node, so when no frontier node
    beats the `total`-th best score so far, nothing below the frontier can enter the kept tree."""
    if total <= 0:  # nothing is kept: no node can enter
        return True
    scored = torch.cat(pool_scores)
    if scored.numel() < total:
        return False
    return bool(frontier_scores.max() <= scored.topk(total).values[-1])


def pool_size(topk: int, depth: int) -> int:
    """How many nodes `grow_tree` scores at most: `topk` children of the root, then `topk`
    children of each of `topk` frontier nodes per further level."""
    return topk + max(0, depth - 1) * topk * topk


class FrontierRows:
    """Where a drafter's own cache holds each node it has fed while growing a tree, so the next
    frontier attends to the right rows: the `prefix` true positions, its ancestors, itself.

    Kept as tensors on the drafter's device (for each search node, the cache columns it sees), so
    placing a level is a few tensor operations: no per-node Python and no transfer to the host.
    `grow_tree` feeds one level per call, so the nodes of the n-th call all sit at depth n."""

    def __init__(self, prefix: int, pool: int, device: torch.device) -> None:
        """`pool`: the search's node ids are below it (`pool_size`); a tree feeds fewer nodes than
        that, so `prefix + pool` columns hold every row the tree adds to the cache."""
        self.root = torch.zeros(prefix + pool, dtype=torch.bool, device=device)
        self.root[:prefix] = True  # a child of the root sees the true positions only, then itself
        self.seen = torch.zeros(pool, prefix + pool, dtype=torch.bool, device=device)  # node -> columns
        self.depth = 0

    def place(self, nodes: torch.Tensor, parents: torch.Tensor, cached: int) -> tuple[torch.Tensor, int]:
        """Feed `nodes` (children of `parents`, -1 for the root; search-pool ids, on the device)
        after `cached` rows: returns which rows each may see ([m, cached + m] bool) and their depth
        (their position is the root's + depth)."""
        m = nodes.numel()
        rows = torch.where((parents < 0)[:, None], self.root, self.seen[parents.clamp(min=0)])
        own = torch.arange(m, device=rows.device)
        rows[own, cached + own] = True
        self.seen[nodes] = rows
        self.depth += 1
        return rows[:, : cached + m], self.depth


def cut_tree(tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, depths: torch.Tensor,
             total: int) -> DraftTree:
    """The `total` best candidates (score, then shallower first), renumbered depth first with
    each node's children in score order: the drafter's preferred path is nodes 0, 1, 2, ..., so
    when the target accepts along it the kept rows are a prefix, and the target's cache is cut
    rather than gathered. Parents come before their children, and siblings keep their order."""
    score, depth, parent_of = scores.float().tolist(), depths.tolist(), parents.tolist()  # one transfer
    order = sorted(range(len(score)), key=lambda i: (-score[i], depth[i], i))
    best = order[: min(total, len(score))]
    chosen = set(best)
    if any(parent_of[i] >= 0 and parent_of[i] not in chosen for i in best):
        raise ValueError("cut_tree: a kept node's parent was cut")  # impossible with monotone scores
    children: dict[int, list[int]] = {}
    for i in best:  # in score order, so each parent's children come best first
        children.setdefault(parent_of[i], []).append(i)
    kept, stack = [], children.get(-1, [])[::-1]
    while stack:  # depth first, the best child first
        node = stack.pop()
        kept.append(node)
        stack.extend(children.get(node, [])[::-1])
    renumber = {old: new for new, old in enumerate(kept)}
    new_parents = [-1 if parent_of[i] < 0 else renumber[parent_of[i]] for i in kept]
    index = torch.tensor(kept, dtype=torch.long, device=tokens.device)
    return DraftTree(tokens[index], torch.tensor(new_parents, dtype=torch.long))


def tree_from_paths(paths: list[list[int]], total: int, device: torch.device) -> DraftTree:
    """A trie of token paths (earlier paths preferred), cut to at most `total` nodes breadth
    first: what a drafter without a distribution (n-gram lookup) proposes as branches."""
    children: list[dict[int, int]] = [{}]  # trie node 0 is the root
    trie_parent, trie_token, trie_depth = [-1], [-1], [0]
    for path in paths:
        node = 0
        for token in path:
            if token not in children[node]:
                children[node][token] = len(trie_token)
                children.append({})
                trie_parent.append(node)
                trie_token.append(token)
                trie_depth.append(trie_depth[node] + 1)
            node = children[node][token]
    # breadth first, each level in insertion (preference) order
    nodes = sorted(range(1, len(trie_token)), key=lambda i: (trie_depth[i], i))[:total]
    renumber = {old: new for new, old in enumerate(nodes)}
    parents = [-1 if trie_parent[i] == 0 else renumber[trie_parent[i]] for i in nodes]
    return DraftTree(torch.tensor([trie_token[i] for i in nodes], dtype=torch.long, device=device),
                     torch.tensor(parents, dtype=torch.long))
