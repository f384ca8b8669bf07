"""The verifier: which drafts stand, under strict or MARS verification and fixed sampling settings.

The rules themselves are pure tensor functions over a flattened batch of draft trees (rules.py);
the verifier chooses which to apply, reads the target's draws (each position's Gumbel noise,
sampling.PositionNoise) and brings the outcome to the host in exactly one device->host transfer
per call. The single-sequence loop verifies a batch of one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from .rules import (DraftBatch, accepted_paths, coupled_choices, examined_rows, first_sibling, greedy_choices, margin,
                    per_request, top_two)
from .sampling import PositionNoise, SamplingParams, coupled_sample, process_logits
from .tree import DraftTree

Rule = Literal["strict", "mars"]
DEFAULT_THRESHOLD = 0.9  # the paper's global theta


@dataclass
class Verdict:
    """The outcome of one request's round, already on the host."""

    accepted_positions: list[int]  # the accepted nodes, root side first (a chain's are 0 .. n-1)
    next_token: int  # correction (after the last accepted node) or bonus (past a leaf)
    relaxed: int  # accepted drafts the strict rule would have rejected
    examined: int  # rows whose children the rule looked at (the root and accepted nodes with children)
    low_margin: int  # examined rows that were low-margin (MARS only)
    margins: torch.Tensor | None  # margins of the examined rows (MARS only)


@dataclass
class _Decided:
    """The rules' outcome for a batch, still on the device."""

    path: torch.Tensor  # [N] bool: accepted nodes
    next_tokens: torch.Tensor  # [B]
    relaxed: torch.Tensor  # [B]
    examined: torch.Tensor  # [N + B] bool
    low_margin: torch.Tensor  # [B]
    faulty: torch.Tensor  # [B]: rows with NaN or infinite logits
    margins: torch.Tensor | None  # [N + B]


@dataclass(frozen=True)
class Verifier:
    """Strict or MARS verification under fixed sampling settings."""

    rule: Rule = "strict"
    threshold: float = DEFAULT_THRESHOLD
    measure: Literal["logit-ratio", "prob-ratio"] = "logit-ratio"
    sampling: SamplingParams = SamplingParams()

    def verify(self, logits: torch.Tensor, tree: DraftTree, noise: PositionNoise | None = None,
               position: int = 0) -> Verdict:
        """One sequence: `logits` [n + 1, V] score the pending token and the tree's n nodes; the
        pending token's row draws the token at `position` of the sequence (sampling reads
        `noise` there; None: fresh noise, as an unseeded run)."""
        if self.sampling.greedy and self.rule == "strict":
            return self._plain_greedy(logits) if tree.size == 0 else self._strict_greedy(logits, tree)
        return self.verify_batch(logits, DraftBatch.of_trees([tree], logits.device), [noise], [position])[0]

    def verify_batch(self, logits: torch.Tensor, batch: DraftBatch, noises: Sequence[PositionNoise | None] = (),
                     positions: Sequence[int] = ()) -> list[Verdict]:
        """A batch in vLLM's layout: `logits` [N + B, V], one row per request's pending token and
        per draft, request after request; each request samples with its own noise from its own
        position (missing: fresh noise, position 0). One host transfer for the whole batch."""
        decided = self._decide(logits, batch, noises, positions)
        summary = torch.cat([decided.next_tokens, decided.relaxed, decided.low_margin, decided.faulty,
                             decided.path.long(), decided.examined.long()]).tolist()  # the single host sync
        b, n = batch.requests, batch.size
        next_tokens, relaxed, low, faulty = (summary[i * b : (i + 1) * b] for i in range(4))
        path, examined = summary[4 * b : 4 * b + n], summary[4 * b + n :]
        if any(faulty):
            raise self._fault(logits)
        verdicts, node, row = [], 0, 0
        for request, count in enumerate(batch.counts):
            rows = [r for r in range(row, row + count + 1) if examined[r]]
            margins = None if decided.margins is None else decided.margins[rows]
            verdicts.append(Verdict([i for i in range(count) if path[node + i]], next_tokens[request],
                                    relaxed[request], len(rows), low[request], margins))
            node, row = node + count, row + count + 1
        return verdicts

    def _plain_greedy(self, logits: torch.Tensor) -> Verdict:
        """A round with no drafts under strict greedy: the argmax of the pending row, exactly as
        the batched rules pick it (the same `max`), in a third of their time (0.18 against 0.50 ms
        on one row of 49,152 logits, a loaded AMD EPYC, where a llama.cpp step is 9 ms)."""
        processed = logits[:1] if self.sampling.order_only else process_logits(logits[:1], self.sampling)
        row_max, top1 = processed.max(dim=-1)
        token = int(torch.where(torch.isfinite(row_max), top1, -1).item())  # the single host sync
        if token < 0:
            raise self._fault(logits[:1])
        return Verdict([], token, 0, 0, 0, None)

    def _strict_greedy(self, logits: torch.Tensor, tree: DraftTree) -> Verdict:
        """Strict greedy on one tree without the batched rules' few dozen small tensor operations
        (a millisecond a round on 2 cores, where a quantized verification is ten): every row's
        argmax (the same `max` as the rules take, so the same ties), then the accepted path walked
        on the host: from the pending row, the first child whose token is that row's argmax, and
        on from it. The batched rules' verdict (tested against them), one host sync."""
        processed = logits if self.sampling.order_only else process_logits(logits, self.sampling)
        row_max, top1 = processed.max(dim=-1)
        rows = tree.size + 1
        summary = torch.cat([top1, torch.isfinite(row_max).long(), tree.tokens.to(top1.device)]).tolist()
        argmax, finite, tokens = summary[:rows], summary[rows : 2 * rows], summary[2 * rows :]
        if not all(finite):
            raise self._fault(logits)
        children: dict[int, list[int]] = {}  # a row -> its children's node indices, in order (node i is row i + 1)
        for node, parent in enumerate(tree.parents.tolist()):
            children.setdefault(parent + 1, []).append(node)
        accepted, row, examined = [], 0, 0
        while row in children:
            examined += 1
            chosen = next((node for node in children[row] if tokens[node] == argmax[row]), None)
            if chosen is None:
                break
            accepted.append(chosen)
            row = chosen + 1
        return Verdict(accepted, argmax[row], 0, examined, 0, None)

    def _fault(self, logits: torch.Tensor) -> FloatingPointError:
        """What went wrong, for a round with a faulty row: the target's own logits, or (when they
        are finite) the sampling settings' arithmetic on them (logits / T overflowing float32).
        Only on this error path: one more look at the logits costs nothing in a normal round."""
        if bool(torch.isfinite(logits.float().max(dim=-1).values).all()):  # as `faulty_rows`, on the raw rows
            return FloatingPointError(f"the target's logits divided by --temperature {self.sampling.temperature:g} "
                                      f"overflow float32; use a larger temperature (or 0 for greedy)")
        return FloatingPointError("the target produced NaN or infinite logits; refusing to emit tokens")

    def _decide(self, logits: torch.Tensor, batch: DraftBatch, noises: Sequence[PositionNoise | None],
                positions: Sequence[int]) -> _Decided:
        # greedy rules read the order and the top two values only: the logits as they come (a
        # float32 copy of [rows, V] bfloat16 logits cost more than the rule itself)
        processed = logits if self.sampling.order_only else process_logits(logits, self.sampling)
        mars = self.rule == "mars"
        low = margins = in_top_two = None
        if self.sampling.greedy and not mars:  # the argmax is all strict greedy needs: one pass with the max
            row_max, top1 = processed.max(dim=-1)
            top2 = top1
        else:
            top1, top2, z1, z2 = top_two(processed)
            row_max = z1
        faulty_rows = ~torch.isfinite(row_max)  # NaN anywhere poisons the row's max
        if mars:
            margins = margin(z1, z2, self.measure)
            low = (margins > self.threshold) & torch.isfinite(z2)
        if self.sampling.greedy:
            ok, strict = greedy_choices(batch, top1, top2, low)
        else:  # every row's own draw; a faulty round raises before emitting any
            sampled = coupled_sample(processed, _noise_rows(batch, noises, positions, processed))
            if mars:
                parent_rows = batch.parent_rows
                in_top_two = (batch.tokens == top1[parent_rows]) | (batch.tokens == top2[parent_rows])
            ok, strict = coupled_choices(batch, sampled, in_top_two, low)
        path, last_rows = accepted_paths(batch, first_sibling(ok, batch.parent_rows))
        next_tokens = (top1 if self.sampling.greedy else sampled)[last_rows]
        examined = examined_rows(batch, path)
        no_counts = torch.zeros(batch.requests, dtype=torch.long, device=logits.device)
        return _Decided(path, next_tokens, per_request(batch, path & ~strict), examined,
                        no_counts if low is None else per_request(batch, low & examined, by_row=True),
                        per_request(batch, faulty_rows, by_row=True), margins)


def _noise_rows(batch: DraftBatch, noises: Sequence[PositionNoise | None], positions: Sequence[int],
                logits: torch.Tensor) -> torch.Tensor:
    """[N + B, V]: each row's Gumbel noise, at the position its token would take (a request's
    position plus the row's depth), from that request's noise."""
    parts, row = [], 0
    for request, count in enumerate(batch.counts):
        noise = noises[request] if request < len(noises) else None
        if noise is None:
            noise = PositionNoise(None, logits.shape[-1], logits.device)
        start = positions[request] if request < len(positions) else 0
        depths = batch.row_depths[row : row + count + 1]
        parts.append(noise.rows([start + depth for depth in depths], logits.shape[-1], logits.device))
        row += count + 1
    return parts[0] if len(parts) == 1 else torch.cat(parts)
