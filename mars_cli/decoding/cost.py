"""A cost model: what one target forward costs by its width, and the draft length and tree
shape that buy the most tokens per second with it.

Speculative decoding pays only when a verification pass over k + 1 positions costs little more
than a pass over one, and how much more depends on the device, the dtype and the kernels: on this
project's CPU in float32 a width of 3 costs more than a width of 5, in bfloat16 widths up to 8 are
free. So the curve is measured, not assumed, by the tuning layer (tuning/curve.py); this module
only plans with it. The per-round controller that follows a session's own timings is in
controller.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from .acceptance import EARLY_HEAD, DraftAcceptance
from .tree import CHAIN, TreeShape

SCHEMA = 4  # 3: widths 1..17, 25, 33, 49, 65 (draft trees); any subset of them; 4: the choice protocol's entries
DEFAULT_WIDTHS = (*range(1, 18), 25, 33, 49, 65)  # what `mars profile --widths` measures
# A compiled scorer has one graph per width, each a compile (about 30 s cold on a GPU, 45 s on this
# project's CPU): with `--num-draft auto` a chain drafts this many tokens or none (widths 1 and 5),
# and the curve also measures a 16-node tree's width, the one tree size `auto` may pick there.
COMPILED_DRAFT = 4
COMPILED_TREE_TOKENS = 16
COMPILED_WIDTHS = (1, COMPILED_DRAFT + 1, COMPILED_TREE_TOKENS + 1)
# A chain-or-tree verdict closer than this (in milliseconds per token) is timed again before it
# stands: forwards on a shared 2-core VM vary by about 15% one to the next, and on an AMD EPYC with
# AVX512-BF16 eight curves of 5 forwards a width put a 9-wide forward at 1.05-1.33x a plain one,
# while real decoding's tree won by 3-12% (docs/benchmarks.md). The tuning layer times them again.
SHAPE_CLOSE = 0.15


class Costs(Protocol):
    """Anything that prices a forward by its width: a `CostCurve`, or controller.LiveCosts."""

    def cost(self, width: int) -> float: ...


@dataclass(frozen=True)
class CostCurve:
    """Milliseconds per target forward by width (positions fed), after `context` cached tokens."""

    key: dict
    ms_by_width: dict[int, float]
    settled: frozenset[int] = frozenset()  # widths timed again, together, for a close chain-or-tree call

    def cost(self, width: int) -> float:
        """The measured cost at `width`; between measured widths the next wider one (a forward
        is never assumed cheaper than a narrower measured one would suggest), and past the
        widest a linear extrapolation from the last two."""
        widths = sorted(self.ms_by_width)
        if width in self.ms_by_width:
            return self.ms_by_width[width]
        wider = [w for w in widths if w > width]
        if wider:
            return self.ms_by_width[wider[0]]
        if len(widths) == 1:
            return self.ms_by_width[widths[0]] * width / widths[0]
        a, b = widths[-2], widths[-1]
        slope = max(0.0, (self.ms_by_width[b] - self.ms_by_width[a]) / (b - a))
        return self.ms_by_width[b] + slope * (width - b)

    def fields(self) -> dict:
        """What an entry of the curve records beside its key."""
        return {"ms_by_width": {str(w): ms for w, ms in sorted(self.ms_by_width.items())},
                "settled": sorted(self.settled)}


MAX_TREE_TOKENS = 64
TREE_DEPTH = 6  # `--num-draft auto` with a tree: the most levels searched
TREE_DEPTHS = (3, 4, 5, 6)  # the depths auto chooses from (or none); each level is one drafter step
TREE_SIZES = (8, 16, 24, 32, 48, 64)  # a curve measures widths 9, 17, 25, 33, 49 and 65
SHAPE_WIDTHS = (1, *(n + 1 for n in TREE_SIZES))  # all that `tree_shape` reads
TREE_TOPK = 4


def tree_shape(curve: CostCurve, acceptance: DraftAcceptance = EARLY_HEAD) -> TreeShape:
    """`--draft-topk auto` / `--draft-tokens auto`: the tree whose verification forward costs the
    fewest milliseconds per expected token (its measured width's cost over the drafter's tau at
    that size), or a chain where the best chain of up to ESTIMATE_MAX_DRAFT drafts costs fewer
    (float32 on a CPU, where width is dear). Only measured widths count (a compiled curve has 1, 5
    and 17). A fixed cap on the tree's cost relative to a plain step (1.2x, until 2026-12-01) turned
    on noise: on the Intel Xeon with AMX a 9-wide forward measured 1.204x and the default drafted
    chains at 1.34x plain instead of trees at 1.68x; stale acceptance figures (an early head's, until
    2026-12-02) had an AMD EPYC draft chains at 1.64x plain where 4 x 8 trees ran at 1.80x."""
    return shape_verdict(curve, acceptance).shape


@dataclass(frozen=True)
class ShapeVerdict:
    """`tree_shape`'s answer with what decided it: `closeness`, |tree / chain - 1| of their
    milliseconds per token (inf when only one was possible), and `deciding`, the widths whose
    costs made the call (width 1, the best chain's and the best tree's)."""

    shape: TreeShape
    closeness: float
    deciding: tuple[int, ...]


def _tree_costs(curve: CostCurve, acceptance: DraftAcceptance) -> dict[int, float]:
    """Milliseconds per expected token of each tree size whose width the curve measured (never an
    extrapolated width)."""
    return {n: curve.ms_by_width[n + 1] / acceptance.tree(n) for n in TREE_SIZES if n + 1 in curve.ms_by_width}


def best_tree_size(curve: CostCurve, acceptance: DraftAcceptance = EARLY_HEAD) -> int:
    """The tree size (nodes a round) cheapest per token on this curve, whether or not a chain is
    cheaper still: `--draft-topk K --draft-tokens auto` asked for a tree, and gets the best one (the
    smallest size when the curve measured none)."""
    trees = _tree_costs(curve, acceptance)
    return min(trees, key=trees.get) if trees else TREE_SIZES[0]


def shape_verdict(curve: CostCurve, acceptance: DraftAcceptance = EARLY_HEAD) -> ShapeVerdict:
    """See `tree_shape`."""
    trees = _tree_costs(curve, acceptance)
    if not trees:
        return ShapeVerdict(CHAIN, math.inf, ())
    size = best_tree_size(curve, acceptance)
    chain_ms, k = _best_chain(curve, acceptance)
    shape = TreeShape(TREE_TOPK, size) if trees[size] < chain_ms else CHAIN
    if k == 0:  # no chain width measured: nothing to weigh the tree against
        return ShapeVerdict(shape, math.inf, ())
    return ShapeVerdict(shape, abs(trees[size] / chain_ms - 1), tuple(sorted({1, k + 1, size + 1})))



# `--dtype auto` for a session that drafts (tuning/dtype.py) compares dtypes by what a round
# of the best shape each one affords would cost per token: chains up to ESTIMATE_MAX_DRAFT, or the
# tree `tree_shape` picks, at the default drafter's figures (acceptance.py).
ESTIMATE_MAX_DRAFT = 4
ESTIMATE_WIDTHS = tuple(sorted({*range(1, ESTIMATE_MAX_DRAFT + 2), *SHAPE_WIDTHS}))


def _best_chain(curve: CostCurve, acceptance: DraftAcceptance, min_k: int = 1) -> tuple[float, int]:
    """(milliseconds of target forwards per emitted token, k) for the best chain of min_k up to
    ESTIMATE_MAX_DRAFT drafts at measured widths (k = 0: plain decoding; positions past the
    figures' last are accepted at its rate); a plain step's cost when no chain width was measured."""
    measured = [k for k in range(1, ESTIMATE_MAX_DRAFT + 1) if k + 1 in curve.ms_by_width]
    if not measured and min_k > 0:
        return curve.cost(1), 0
    k = best_draft_length(curve, acceptance.chain, 0.0, ESTIMATE_MAX_DRAFT, min_k=min_k, lengths=measured)
    return curve.cost(k + 1) / expected_tokens(acceptance.chain, k), k


def speculative_estimate(curve: CostCurve, acceptance: DraftAcceptance = EARLY_HEAD) -> tuple[float, str]:
    """(milliseconds of target forwards per emitted token, the shape) for the cheapest of: plain
    decoding, a chain of 1..ESTIMATE_MAX_DRAFT, and the tree `tree_shape` picks from this curve,
    at the drafter's figures. Drafting's own cost is left out: it is about the same in every dtype,
    and what differs between dtypes is what the target's width costs. Only measured widths count."""
    ms, k = _best_chain(curve, acceptance, min_k=0)
    options = [(ms, f"a chain of {k}" if k else "plain decoding")]
    shape = tree_shape(curve, acceptance)
    if shape.branches:
        options.append((curve.ms_by_width[shape.tokens + 1] / acceptance.tree(shape.tokens),
                        f"a {shape.topk} x {shape.tokens} tree"))
    return min(options)


def shape_widths(compiled: bool) -> tuple[int, ...]:
    """The widths `tree_shape` reads: a compiled scorer's one tree width, or every tree size's."""
    return (1, COMPILED_TREE_TOKENS + 1) if compiled else SHAPE_WIDTHS


def chain_widths(max_draft: int, compiled: bool) -> tuple[int, ...]:
    """The widths a chain of at most `max_draft` tokens verifies (a compiled scorer: its one)."""
    return (1, COMPILED_DRAFT + 1) if compiled else tuple(range(1, max_draft + 2))


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """Tokens one round emits on average with k drafts, given the chance that each draft
    position is accepted when all before it were (`acceptance[i]` for position i; positions past
    the list reuse its last value): 1 + a0 + a0*a1 + ... (the bonus or correction always comes)."""
    total, reach = 1.0, 1.0
    for position in range(k):
        rate = acceptance[min(position, len(acceptance) - 1)] if acceptance else 0.0
        reach *= min(max(rate, 0.0), 1.0)
        total += reach
    return total


def best_draft_length(curve: Costs, acceptance: Sequence[float], draft_ms: float | Callable[[int], float],
                      max_k: int, min_k: int = 1, lengths: Sequence[int] | None = None,
                      width: Callable[[int], int] | None = None, propose_rate: float = 1.0,
                      miss_ms: float = 0.0) -> int:
    """The k in [min_k, max_k] (and in `lengths`, when given) with the most expected tokens per
    millisecond: a round costs one forward of width k + 1 (or `width(k)`: a tree's is fixed) plus
    its drafting, `draft_ms(k)` or k steps of `draft_ms` each. k = 0, plain decoding (one forward
    of width 1, no drafting), is allowed when min_k is 0. A drafter asked for a draft proposes
    one with probability `propose_rate`; otherwise (an n-gram with no match, a head below its
    confidence gate) the round is a plain step that also paid `miss_ms` for asking."""
    def drafting(k: int) -> float:
        return draft_ms(k) if callable(draft_ms) else k * draft_ms

    def rate(k: int) -> float:
        if k == 0:
            return 1.0 / curve.cost(1)
        fed = k + 1 if width is None else width(k)
        p = min(max(propose_rate, 0.0), 1.0)
        tokens = p * expected_tokens(acceptance, k) + (1 - p)
        return tokens / (p * (curve.cost(fed) + drafting(k)) + (1 - p) * (curve.cost(1) + miss_ms))

    candidates = [k for k in range(min_k, max_k + 1) if lengths is None or k == 0 or k in lengths] or [min_k]
    return max(candidates, key=lambda k: (rate(k), -k))


# --------------------------------------------------------------------------- measuring
