"""Verification rules: strict (lossless) and MARS (margin-aware), greedy and sampling forms.

Everything here is a pure function over tensors, vectorised over the k draft positions: no
per-token Python loop and exactly one device->host transfer per round (in `Verifier.verify`).

Shapes: the target scores the last accepted token plus k drafts, so `logits` is [k+1, V],
`drafts` is [k], and the drafter's distribution `draft_probs` is [k, V] or None (a drafter
without a distribution, such as n-gram lookup, has a one-hot q at its token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from .sampling import SamplingParams, probabilities, process_logits
from .tree import DraftTree

Rule = Literal["strict", "mars"]
MarginMeasure = Literal["logit-ratio", "prob-ratio"]
MARGIN_MEASURES: tuple[str, ...] = ("logit-ratio", "prob-ratio")
DEFAULT_THRESHOLD = 0.9  # the paper's global theta


# --------------------------------------------------------------------------- margins
def top_two(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top1 ids, top2 ids, z1, z2) per row. top1 is argmax (the greedy choice, first index on
    ties); top2 is the best of the rest, so a tie for first place gives z1 == z2."""
    top1 = logits.argmax(dim=-1)
    z1 = logits.gather(-1, top1[:, None])[:, 0]
    rest = logits.scatter(-1, top1[:, None], float("-inf"))
    top2 = rest.argmax(dim=-1)
    z2 = rest.gather(-1, top2[:, None])[:, 0]
    return top1, top2, z1, z2


def top_two_values(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(z1, z2): the two largest values of each row (equal on a tie for first place)."""
    top = logits.topk(2, dim=-1).values
    return top[:, 0], top[:, 1]


class TopTwoRecorder:
    """A decoding observer (`decode(..., observe=)`) that keeps the two largest raw logits of
    every emitted position: what calibration fits thresholds on and `mars profile` draws."""

    def __init__(self) -> None:
        self.z1: list[torch.Tensor] = []
        self.z2: list[torch.Tensor] = []

    def __call__(self, logits: torch.Tensor) -> None:
        z1, z2 = top_two_values(logits)
        self.z1.append(z1)
        self.z2.append(z2)

    def values(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All positions so far, in order ([n] each; empty when nothing was emitted)."""
        if not self.z1:
            return torch.empty(0), torch.empty(0)
        return torch.cat(self.z1), torch.cat(self.z2)


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


def accepted_length(ok: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of a bool vector (0-dim tensor, stays on device)."""
    return ok.long().cumprod(dim=0).sum()


# --------------------------------------------------------------------------- acceptance masks
def greedy_accepts(
    drafts: torch.Tensor, top1: torch.Tensor, top2: torch.Tensor, low_margin: torch.Tensor | None
) -> torch.Tensor:
    """Greedy rule per position. Strict: draft == top1. MARS (paper, Algorithm 1): also accept
    the runner-up where the position is low-margin. `low_margin=None` means strict."""
    ok = drafts == top1
    if low_margin is not None:
        ok = ok | ((drafts == top2) & low_margin)
    return ok


def sampling_accepts(
    draft_p: torch.Tensor,
    draft_q: torch.Tensor,
    uniforms: torch.Tensor,
    in_top_two: torch.Tensor | None,
    low_margin: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampling rule per position -> (accepted, accepted_by_strict_rule).

    Strict: accept with probability min(1, p(x)/q(x)), i.e. u * q(x) < p(x). MARS (the authors'
    released behaviour): at a low-margin position also accept x deterministically when it is the
    target's top-1 or top-2. The same uniforms drive both, so MARS with a threshold nothing can
    pass reproduces strict sampling exactly.
    """
    strict = uniforms * draft_q < draft_p
    if low_margin is None or in_top_two is None:
        return strict, strict
    return strict | (low_margin & in_top_two), strict


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)) per row; where p == q leaves no mass, fall back to p."""
    residual = (p - q).clamp_min(0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp_min(1e-30), p)


# --------------------------------------------------------------------------- trees
# A tree's rows: 0 is the root (the pending token), node i is row i + 1 and its parent's row is
# parents[i] + 1. The target's row r scores the children of row r. Siblings are tried in order.
def first_sibling(ok: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """Per node: `ok` and no earlier sibling `ok`: which child each parent moves to (at most one)."""
    n = ok.shape[0]
    same_parent = parents[:, None] == parents[None, :]
    earlier = torch.ones(n, n, dtype=torch.bool, device=ok.device).tril(-1)
    return ok & ~(same_parent & earlier & ok[None, :]).any(dim=-1)


def accepted_path(chosen: torch.Tensor, ancestors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(path [n] bool, last accepted row): the deepest node whose ancestors (and itself) were all
    chosen, and the nodes on the way to it. `ancestors[i, j]`: node j is node i or above it.
    With at most one chosen child per parent the accepted nodes form one path from the root."""
    reached = ~(ancestors & ~chosen[None, :]).any(dim=-1)
    depth = torch.where(reached, ancestors.sum(dim=-1), torch.zeros_like(chosen, dtype=torch.long))
    deepest = depth.argmax()
    path = ancestors[deepest] & (depth[deepest] > 0)
    last_row = torch.where(depth[deepest] > 0, deepest + 1, torch.zeros_like(deepest))
    return path, last_row


def tree_greedy_accepts(tokens: torch.Tensor, parents: torch.Tensor, top1: torch.Tensor, top2: torch.Tensor,
                        low_margin: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy rule on a tree -> (chosen child per parent, chosen by the strict rule). Strict: the
    child equal to the target's argmax at its parent. MARS: where the parent's row is low-margin
    and no child is the argmax, the child equal to the runner-up. `low_margin` is per row [n + 1]."""
    rows = parents + 1
    strict = tokens == top1[rows]
    if low_margin is None:
        return strict, strict
    strict_sibling = (strict[None, :] & (parents[:, None] == parents[None, :])).any(dim=-1)
    relaxed = low_margin[rows] & (tokens == top2[rows]) & ~strict_sibling
    return strict | relaxed, strict


def tree_sampling_accepts(p: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, uniforms: torch.Tensor,
                          in_top_two: torch.Tensor | None, low_margin: torch.Tensor | None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampling rule on a tree -> (chosen child per parent, accepted by the strict rule).

    Strict: recursive rejection sampling over each parent's children, the drafter's proposals
    taken as given (one-hot q): child i is accepted with probability p(x_i) / (1 - the mass of
    the earlier siblings, already rejected), i.e. from the target's distribution with the rejected
    tokens removed; the first accepted sibling is the one taken. The chance that some child is
    taken is the target mass on the children, and the draw is exact in distribution whatever
    the drafter chose (`next_token_distribution` gives the rest). MARS: at a low-margin parent a
    child that is the target's top-1 or top-2 is also accepted, with the same uniforms, so a
    threshold nothing passes reproduces strict exactly."""
    rows = parents + 1
    mass = p[rows, tokens]
    same_parent = parents[:, None] == parents[None, :]
    earlier = torch.ones_like(same_parent).tril(-1) & same_parent
    before = (earlier.to(mass.dtype) * mass[None, :]).sum(dim=-1)
    strict = uniforms * (1 - before).clamp_min(0) < mass
    ok = strict if low_margin is None or in_top_two is None else strict | (low_margin[rows] & in_top_two)
    return first_sibling(ok, parents), strict


def next_token_distribution(p: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                            last_row: torch.Tensor) -> torch.Tensor:
    """What the token after the accepted path is drawn from: the target's distribution at the last
    accepted row with its children's tokens (all rejected) removed, renormalised ([V])."""
    row = p[last_row].clone()
    rejected = tokens[parents + 1 == last_row]
    row[rejected] = 0
    mass = row.sum()
    return torch.where(mass > 0, row / mass.clamp_min(1e-30), p[last_row])


# --------------------------------------------------------------------------- the verifier
@dataclass
class Verdict:
    """The outcome of one round, already on the host."""

    accepted_positions: list[int]  # indices of the accepted drafts (a chain's are 0 .. n-1)
    next_token: int  # correction (first rejection) or bonus (all accepted)
    relaxed: int  # accepted drafts the strict rule would have rejected
    examined: int  # draft positions the rule looked at (accepted + the rejected one)
    low_margin: int  # examined positions that were low-margin
    margins: torch.Tensor | None  # margins of the examined positions (MARS only)

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_positions)


@dataclass(frozen=True)
class Verifier:
    """Strict or MARS verification under fixed sampling settings."""

    rule: Rule = "strict"
    threshold: float = DEFAULT_THRESHOLD
    measure: MarginMeasure = "logit-ratio"
    sampling: SamplingParams = SamplingParams()

    def verify(
        self,
        logits: torch.Tensor,
        drafts: torch.Tensor,
        draft_probs: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        tree: DraftTree | None = None,
    ) -> Verdict:
        """`tree` (whose tokens are `drafts`) makes the drafts a tree; None is a chain."""
        if tree is not None:
            return self._verify_tree(logits, drafts, tree, generator)
        k = drafts.shape[0]
        processed = process_logits(logits, self.sampling)
        # NaN anywhere poisons the row's max; checked with the round's single host sync
        faulty = (~torch.isfinite(processed.max(dim=-1).values)).any().long()
        if self.sampling.greedy and self.rule == "strict":
            top1 = processed.argmax(dim=-1)
            n = accepted_length(drafts == top1[:k])
            summary = torch.stack([n, top1[n], torch.zeros_like(n), torch.zeros_like(n), faulty])
            return _verdict(summary, k, None)

        top1, top2, z1, z2 = top_two(processed)
        low = None
        margins = None
        if self.rule == "mars":
            margins = margin(z1[:k], z2[:k], self.measure)
            low = (margins > self.threshold) & torch.isfinite(z2[:k])

        if self.sampling.greedy:
            ok = greedy_accepts(drafts, top1[:k], top2[:k], low)
            n = accepted_length(ok)
            within = torch.arange(k, device=logits.device) < n
            relaxed = (within & (drafts != top1[:k])).long()
            next_token = top1[n]
        else:
            p = probabilities(processed)
            rows = torch.arange(k, device=logits.device)
            q = draft_probs if draft_probs is not None else _one_hot(drafts, p.shape[-1], p.dtype)
            draft_p, draft_q = p[rows, drafts], q[rows, drafts]
            uniforms = torch.rand(k, generator=generator, device=logits.device)
            in_top_two = (drafts == top1[:k]) | (drafts == top2[:k])
            ok, strict_ok = sampling_accepts(draft_p, draft_q, uniforms, in_top_two, low)
            n = accepted_length(ok)
            # one vectorised draw per position: residuals at 0..k-1, the bonus from p[k]
            targets = torch.cat([residual_distribution(p[:k], q), p[k:]], dim=0)
            targets = targets.nan_to_num(nan=1.0).clamp_min(0.0)  # a faulty round raises below
            draws = torch.multinomial(targets, 1, generator=generator)[:, 0]
            next_token = draws[n]
            within = torch.arange(k, device=logits.device) < n
            relaxed = (within & ~strict_ok).long()
        summary = torch.stack([n, next_token, relaxed.sum(), torch.zeros_like(n), faulty])
        if low is not None:
            examined = torch.arange(k, device=logits.device) <= n
            summary[3] = (low & examined).sum()
        return _verdict(summary, k, margins)


    def _verify_tree(self, logits: torch.Tensor, tokens: torch.Tensor, tree: DraftTree,
                     generator: torch.Generator | None) -> Verdict:
        """A tree's rules (see the tree section above); one host transfer, as for a chain."""
        n = tokens.shape[0]
        parents = tree.parents.to(logits.device)
        processed = process_logits(logits, self.sampling)
        faulty = (~torch.isfinite(processed.max(dim=-1).values)).any().long()
        low = margins = None
        if self.rule == "strict" and self.sampling.greedy:  # the argmax is all strict greedy needs
            top1 = top2 = processed.argmax(dim=-1)
        else:
            top1, top2, z1, z2 = top_two(processed)
        if self.rule == "mars":
            margins = margin(z1, z2, self.measure)
            low = (margins > self.threshold) & torch.isfinite(z2)
        rows = parents + 1
        if self.sampling.greedy:
            chosen, strict = tree_greedy_accepts(tokens, parents, top1, top2, low)
            chosen = first_sibling(chosen, parents)
        else:
            p = probabilities(processed)
            uniforms = torch.rand(n, generator=generator, device=logits.device)
            in_top_two = (tokens == top1[rows]) | (tokens == top2[rows])
            chosen, strict = tree_sampling_accepts(p, tokens, parents, uniforms, in_top_two, low)
        ancestors = tree.ancestry().to(logits.device)[1:, 1:]
        path, last_row = accepted_path(chosen, ancestors)
        if self.sampling.greedy:
            next_token = top1[last_row]
        else:
            distribution = next_token_distribution(p, tokens, parents, last_row).nan_to_num(nan=1.0).clamp_min(0.0)
            next_token = torch.multinomial(distribution, 1, generator=generator)[0]
        # examined rows: the root and the accepted nodes, where they have children in the tree
        has_children = torch.zeros(n + 1, dtype=torch.bool, device=logits.device)
        has_children[rows] = True
        examined = has_children & torch.cat([torch.ones(1, dtype=torch.bool, device=logits.device), path])
        low_count = (low & examined).sum() if low is not None else torch.zeros((), dtype=torch.long,
                                                                                 device=logits.device)
        relaxed = (path & ~strict).sum()
        summary = torch.cat([torch.stack([next_token, relaxed, low_count, examined.sum(), faulty]).long(),
                             path.long(), examined.long()])
        values = summary.tolist()  # the round's single host sync
        next_id, relaxed_n, low_n, examined_n, bad = values[:5]
        if bad:
            raise FloatingPointError("the target produced NaN or infinite logits; refusing to emit tokens")
        on_path = [i for i, flag in enumerate(values[5 : 5 + n]) if flag]
        examined_rows = [r for r, flag in enumerate(values[5 + n :]) if flag]
        return Verdict(on_path, next_id, relaxed_n, examined_n, low_n,
                       None if margins is None else margins[examined_rows])


def _one_hot(tokens: torch.Tensor, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.nn.functional.one_hot(tokens, vocab).to(dtype)


def _verdict(summary: torch.Tensor, k: int, margins: torch.Tensor | None) -> Verdict:
    n, next_token, relaxed, low, faulty = summary.tolist()  # the round's single host sync
    if faulty:
        raise FloatingPointError("the target produced NaN or infinite logits; refusing to emit tokens")
    examined = min(n + 1, k)
    return Verdict(list(range(n)), next_token, relaxed, examined, low,
                   None if margins is None else margins[:examined])
