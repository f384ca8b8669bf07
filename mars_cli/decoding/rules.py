"""Verification rules: strict (lossless) and MARS (margin-aware), greedy and sampling, as pure
tensor functions over a batch of draft trees.

The layout is vLLM's flattened one (`DraftBatch`): the drafts of every request one after the
other ([N] tokens), and the target's logits with one row per request's pending token plus one
per draft ([N + B, V]), request after request. Each node is scored at its parent's row (the root
is the pending token's row), so a batch is one forest and every rule is a handful of vectorised
operations over all of it: no Python loop per request or per draft. A chain is the tree whose
node i is the child of node i - 1; a single sequence is the batch of one.

The rules, node by node (siblings in the drafter's order of preference):
- strict greedy: the child equal to the target's argmax at its parent;
- MARS greedy (the paper's Algorithm 1): also the child equal to the runner-up, at a parent
  whose margin is low, when no sibling is the argmax;
- strict sampling (our loop, `coupled_choices`): every position's draw is fixed by its Gumbel
  noise (sampling.PositionNoise): the target's token at a row is argmax(processed logits + g),
  and a child is accepted when it is that token. Plain sampling draws the same tokens with the
  same noise, so the output is plain sampling's token for token, whatever was drafted. For
  proposals taken as given (trees, n-gram, greedy chains) each child is accepted with exactly
  the probability recursive rejection sampling gives it (p(x_i) / (1 - the earlier siblings'
  mass)); a sampling drafter draws with the same noise, so it proposes the target's draw
  wherever q and p agree;
- strict sampling as vLLM runs it (`sampling_choices`, for the serving plugin, with vLLM's
  uniforms): recursive rejection sampling over siblings with each node's q. The first child is
  accepted with probability min(1, p(x)/q(x)); after a rejection the parent's target becomes
  normalize(max(0, p - q)) and the next sibling is tested against it; the token after the
  accepted path is drawn from the last accepted row's target after all its children were
  rejected. Exact in distribution whenever each node was drawn from its q independently of
  the uniforms;
- MARS sampling (the authors' released behaviour), under either: at a low-margin parent a child
  that is the target's top-1 or top-2 is also accepted, so a threshold nothing passes
  reproduces strict sampling exactly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from .tree import DraftTree

MarginMeasure = Literal["logit-ratio", "prob-ratio"]
MARGIN_MEASURES: tuple[str, ...] = ("logit-ratio", "prob-ratio")


# --------------------------------------------------------------------------- margins
def top_two(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top1 ids, top2 ids, z1, z2) per row, z1 and z2 in float32 whatever the logits' dtype
    (exact: a wider float holds every bfloat16 or float16 value). top1 is argmax (the greedy
    choice, first index on ties); top2 is the best of the rest, so a tie for first place gives
    z1 == z2."""
    z1, top1 = logits.max(dim=-1)  # one pass for both (argmax, then a gather, took two)
    z2, top2 = logits.scatter(-1, top1[:, None], float("-inf")).max(dim=-1)
    return top1, top2, z1.float(), z2.float()


def top_two_values(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(z1, z2): the two largest values of each row (equal on a tie for first place)."""
    top = logits.topk(2, dim=-1).values
    return top[:, 0], top[:, 1]


def logit_ratio(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """The paper's r = z2 / z1. Undefined as a confidence measure when z1 <= 0 (the ratio then
    grows as the runner-up falls behind), so such positions get -inf: never relaxed."""
    ratio = z2 / z1
    return torch.where((z1 > 0) & torch.isfinite(z2), ratio, torch.full_like(ratio, float("-inf")))


def prob_ratio(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """p2 / p1 = exp(z2 - z1): shift-invariant, 0 when the runner-up was masked out."""
    return torch.exp(z2 - z1).nan_to_num(nan=0.0)


def margin(z1: torch.Tensor, z2: torch.Tensor, measure: MarginMeasure) -> torch.Tensor:
    """Higher means less decisive. Positions with margin > theta are low-margin."""
    return logit_ratio(z1, z2) if measure == "logit-ratio" else prob_ratio(z1, z2)


# --------------------------------------------------------------------------- the batch layout
@dataclass(frozen=True)
class DraftBatch:
    """The drafts of B requests, flattened: N nodes request after request, and where the target
    scored each. Index tensors live on the logits' device; `rank_groups` (host lists) say which
    nodes are their parent's first, second, ... child, for the sampling rule's sibling order."""

    tokens: torch.Tensor  # [N] long
    q: torch.Tensor | None  # [N, V]: each node's draft distribution; None: one-hot (taken as given)
    request: torch.Tensor  # [N] long: which request each node belongs to
    node_rows: torch.Tensor  # [N] long: the logits row fed with each node
    parent_rows: torch.Tensor  # [N] long: the row that scores each node (its parent's)
    root_rows: torch.Tensor  # [B] long: each request's pending-token row
    row_request: torch.Tensor  # [N + B] long: which request each row belongs to
    ancestors: torch.Tensor  # [N, N] bool: ancestors[i, j], node j is node i or above it
    rank_groups: tuple[torch.Tensor, ...]  # nodes that are the r-th child of their parent, r = 0, 1, ...
    counts: tuple[int, ...]  # nodes per request
    row_depths: tuple[int, ...]  # [N + B] per row: 0 for a pending token, a node's depth (1 = the root's child)

    @property
    def size(self) -> int:
        return self.tokens.numel()

    @property
    def requests(self) -> int:
        return len(self.counts)

    @property
    def rows(self) -> int:
        return self.size + self.requests

    @classmethod
    def of(cls, tokens: torch.Tensor, parents: torch.Tensor, counts: Sequence[int],
           q: torch.Tensor | None = None) -> "DraftBatch":
        """From vLLM's layout: `tokens` [N], `parents` [N] (each node's parent within its own
        request, -1 for the pending token; parents before children), `counts` [B] nodes per
        request. The index tensors depend on the shape alone and are cached by it: a decoding
        loop sees the same few shapes (a chain of k, no draft) round after round."""
        layout = _layout(tuple(parents.tolist()), tuple(int(c) for c in counts), str(tokens.device))
        return cls(tokens, q, *layout)

    @classmethod
    def of_trees(cls, trees: Sequence[DraftTree], device: torch.device | None = None) -> "DraftBatch":
        """Trees (the single-sequence loop passes one), moved to `device` (the logits') if given:
        a drafter may run elsewhere than the target's output layer."""
        if device is not None:
            trees = [DraftTree(tree.tokens.to(device), tree.parents, None if tree.q is None else tree.q.to(device))
                     if tree.tokens.device != torch.device(device) else tree for tree in trees]
        tokens = trees[0].tokens if len(trees) == 1 else torch.cat([tree.tokens for tree in trees])
        qs = [tree.q for tree in trees]
        if all(q is None for q in qs):
            q = None
        else:  # a tree without q proposes as given: its rows are one-hot
            vocab = next(q.shape[-1] for q in qs if q is not None)
            q = torch.cat([tree.q if tree.q is not None else _one_hot(tree.tokens, vocab) for tree in trees])
        parents = trees[0].parents if len(trees) == 1 else torch.cat([tree.parents for tree in trees])
        return cls.of(tokens, parents, [tree.size for tree in trees], q)


@functools.lru_cache(maxsize=256)
def _layout(parents: tuple[int, ...], counts: tuple[int, ...], device: str) -> tuple:
    """Every index tensor of a batch of this shape (DraftBatch's fields after `q`), on `device`."""
    parent_of = torch.tensor(parents, dtype=torch.long)
    count_tensor = torch.tensor(counts, dtype=torch.long)
    batch = torch.arange(len(counts))
    request = torch.repeat_interleave(batch, count_tensor, output_size=len(parents))
    first_node = torch.cumsum(count_tensor, 0) - count_tensor
    root_rows = first_node + batch  # each request's rows: its pending token, then its nodes
    node_rows = root_rows[request] + 1 + torch.arange(len(parents)) - first_node[request]
    parent_rows = root_rows[request] + 1 + parent_of
    ancestors = _ancestors(torch.where(parent_of < 0, parent_of, parent_of + first_node[request]))
    same_parent = parent_rows[:, None] == parent_rows[None, :]
    rank = (same_parent & strictly_before(len(parents), same_parent.device)).sum(dim=-1)
    groups = tuple(torch.nonzero(rank == r)[:, 0].to(device) for r in range(int(rank.max()) + 1)) if parents else ()
    row_depths = torch.zeros(len(parents) + len(counts), dtype=torch.long)
    row_depths[node_rows] = ancestors.sum(dim=-1)  # a node and every node above it
    return (request.to(device), node_rows.to(device), parent_rows.to(device), root_rows.to(device),
            torch.repeat_interleave(batch, count_tensor + 1).to(device), ancestors.to(device), groups, counts,
            tuple(row_depths.tolist()))


def _ancestors(parents: torch.Tensor) -> torch.Tensor:
    """[N, N] bool from global parent indices (-1: a root's child): each node and every node
    above it. One vectorised step per level of the deepest tree."""
    n = parents.numel()
    sees = torch.eye(n, dtype=torch.bool)
    above = parents.clone()
    nodes = torch.arange(n)
    while bool((above >= 0).any()):
        climbing = above >= 0
        sees[nodes[climbing], above[climbing]] = True
        above = torch.where(climbing, parents[above.clamp_min(0)], above)
    return sees


def _one_hot(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(tokens, vocab).float()


# --------------------------------------------------------------------------- the rules
def greedy_choices(batch: DraftBatch, top1: torch.Tensor, top2: torch.Tensor, low_margin: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy rule per node -> (acceptable, acceptable by the strict rule). `low_margin` is per
    row [N + B], None for strict."""
    rows = batch.parent_rows
    strict = batch.tokens == top1[rows]
    if low_margin is None:
        return strict, strict
    strict_sibling = (strict[None, :] & (rows[:, None] == rows[None, :])).any(dim=-1)
    relaxed = low_margin[rows] & (batch.tokens == top2[rows]) & ~strict_sibling
    return strict | relaxed, strict


def coupled_choices(batch: DraftBatch, sampled: torch.Tensor, in_top_two: torch.Tensor | None,
                    low_margin: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampling rule with coupled noise per node -> (acceptable, acceptable by the strict rule).
    `sampled` [N + B] is the target's own draw at each row (argmax of its processed logits plus
    that position's Gumbel noise): a child is accepted when it is that draw at its parent; under
    MARS also when its parent is low-margin and it is the target's top-1 or top-2 (`in_top_two`)."""
    strict = batch.tokens == sampled[batch.parent_rows]
    if low_margin is None or in_top_two is None:
        return strict, strict
    return strict | (low_margin[batch.parent_rows] & in_top_two), strict


def sampling_choices(batch: DraftBatch, p: torch.Tensor, uniforms: torch.Tensor, in_top_two: torch.Tensor | None,
                     low_margin: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sampling rule per node -> (acceptable, acceptable by the strict rule, each row's target
    after all its children were rejected [N + B, V]). Siblings are tested in rank order, every
    parent's r-th child at once: child x with q is accepted when u * q(x) < target(x), and the
    parent's target then becomes normalize(max(0, target - q))."""
    strict = torch.zeros_like(batch.tokens, dtype=torch.bool)
    residual = p.clone()
    for nodes in batch.rank_groups:
        rows, tokens = batch.parent_rows[nodes], batch.tokens[nodes]
        target = residual[rows]
        picked = torch.arange(nodes.numel(), device=p.device)
        if batch.q is None:  # one-hot q: the rejected token leaves, the rest is renormalised
            strict[nodes] = uniforms[nodes] < target[picked, tokens]
            residual[rows] = residual_distribution(target, torch.zeros_like(target).scatter_(-1, tokens[:, None], 1.0))
        else:
            q = batch.q[nodes].to(target.dtype)
            strict[nodes] = uniforms[nodes] * q[picked, tokens] < target[picked, tokens]
            residual[rows] = residual_distribution(target, q)
    accepted = strict if low_margin is None or in_top_two is None else strict | (low_margin[batch.parent_rows] & in_top_two)
    return accepted, strict, residual


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)) per row; where p <= q leaves no mass, fall back to p."""
    residual = (p - q).clamp_min(0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp_min(1e-30), p)


def first_sibling(ok: torch.Tensor, parent_rows: torch.Tensor) -> torch.Tensor:
    """Per node: `ok` and no earlier sibling `ok`: which child each parent moves to (at most one)."""
    same_parent = parent_rows[:, None] == parent_rows[None, :]
    earlier = strictly_before(len(parent_rows), parent_rows.device)
    return ok & ~(same_parent & earlier & ok[None, :]).any(dim=-1)


def strictly_before(n: int, device: torch.device) -> torch.Tensor:
    """[n, n] bool: column j comes before row i (a boolean `tril(-1)`, which is ~20x slower on CPU)."""
    order = torch.arange(n, device=device)
    return order[:, None] > order[None, :]


def accepted_paths(batch: DraftBatch, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(path [N] bool, last accepted row per request [B]): in each request, the deepest node whose
    ancestors (and itself) were all chosen, and the nodes on the way to it; the pending token's
    row when none was. With at most one chosen child per parent each request's accepted nodes
    form one path from its root, so its deepest node is unique."""
    if batch.size == 0:
        return chosen, batch.root_rows
    reached = ~(batch.ancestors & ~chosen[None, :]).any(dim=-1)
    depth = torch.where(reached, batch.ancestors.sum(dim=-1), torch.zeros_like(batch.tokens))
    member = batch.request[None, :] == torch.arange(batch.requests, device=depth.device)[:, None]
    depth_in = torch.where(member, depth[None, :], torch.zeros_like(depth)[None, :])  # [B, N]
    deepest = depth_in.argmax(dim=-1)
    found = depth_in.gather(-1, deepest[:, None])[:, 0] > 0
    path = (batch.ancestors[deepest] & found[:, None]).any(dim=0)
    return path, torch.where(found, batch.node_rows[deepest], batch.root_rows)


def examined_rows(batch: DraftBatch, path: torch.Tensor) -> torch.Tensor:
    """[N + B] bool: the rows whose children the rule looked at (a root or an accepted node,
    when it has children in the tree)."""
    has_children = torch.zeros(batch.rows, dtype=torch.bool, device=path.device)
    has_children[batch.parent_rows] = True
    on_path = torch.zeros_like(has_children)
    on_path[batch.root_rows] = True
    on_path[batch.node_rows[path]] = True
    return has_children & on_path


def per_request(batch: DraftBatch, values: torch.Tensor, by_row: bool = False) -> torch.Tensor:
    """Sum per request of a per-node (or, `by_row`, per-row) quantity ([B] long)."""
    index = batch.row_request if by_row else batch.request
    return torch.zeros(batch.requests, dtype=torch.long, device=values.device).index_add_(0, index, values.long())
