"""MARS as vLLM's rejection sampler computes it: the same batched rules as our own verifier
(decoding/rules.py), fed with what vLLM's `rejection_sample` receives and returning what it
returns. Pure tensor code with no vLLM import, so it is tested without an engine.

vLLM's layout, for B requests with k_b drafts each (N in all):
- `draft_token_ids` [N] and `target_logits` [N, V]: row i scores draft i (it is the logits row of
  the token before draft i), already processed (penalties, temperature, top-k, top-p);
- `bonus_token_ids` [B, 1]: the token after a request's last draft, drawn by vLLM's sampler;
- the result [B, max k + 1] (int32): accepted drafts, then the correction or bonus token, then
  -1 (vLLM's placeholder).
Our rules read the rows of [N + B] (each request's pending token, then one per draft); target
row i is the row of node i's parent, and the B rows past each request's last draft (the bonus
rows) are never a parent, so only the [N] rows vLLM gives are ever read.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..decoding.rules import (DraftBatch, accepted_paths, examined_rows, first_sibling, greedy_choices, margin,
                              per_request, sampling_choices, top_two)

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: no token at this slot


@dataclass(frozen=True)
class Thresholds:
    """MARS's setting inside vLLM: one measure and theta on the raw-logit scale (T = 1) for greedy
    requests (T = 0) and for sampled ones, as calibration profiles hold them."""

    measure: str
    greedy: float
    sampled: float

    def per_request(self, greedy: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
        """[B] theta on the scale of vLLM's processed logits. The logit ratio ignores temperature;
        the probability ratio at T is (its T = 1 value) ** (1 / T)."""
        theta = torch.where(greedy, torch.tensor(self.greedy), torch.tensor(self.sampled)).to(greedy.device)
        if self.measure == "prob-ratio" and temperature is not None:
            scale = torch.where(greedy, torch.ones_like(temperature), temperature.float())
            theta = theta ** (1.0 / scale)
        return theta


@dataclass
class Outcome:
    """One call's result: vLLM's output tensor, and MARS's counts per request (on the device:
    the caller adds them up without a host sync)."""

    output_token_ids: torch.Tensor  # [B, max k + 1] int32
    accepted: torch.Tensor  # [B] drafts accepted
    relaxed: torch.Tensor  # [B] accepted drafts the strict rule would have rejected
    examined: torch.Tensor  # [B] positions whose drafts the rule looked at
    low_margin: torch.Tensor  # [B] of those, the low-margin ones


@functools.lru_cache(maxsize=256)
def _chain_parents(counts: tuple[int, ...]) -> torch.Tensor:
    """Each draft's parent within its request: vLLM drafts chains (node i follows node i - 1)."""
    return torch.tensor([parent for count in counts for parent in range(-1, count - 1)], dtype=torch.long)


def mars_rejection_sample(draft_token_ids: torch.Tensor, num_draft_tokens: list[int], target_logits: torch.Tensor,
                          bonus_token_ids: torch.Tensor, draft_probs: torch.Tensor | None, greedy: torch.Tensor,
                          thresholds: Thresholds, temperature: torch.Tensor | None = None,
                          uniforms: torch.Tensor | None = None,
                          generators: dict[int, torch.Generator] | None = None) -> Outcome:
    """Decide a batch of draft chains under MARS.

    `greedy` [B] bool says which requests decode at T = 0; `temperature` [B] (vLLM's, 0 for
    greedy ones) scales a prob-ratio theta; `uniforms` [N] are the rejection test's draws (vLLM's
    `generate_uniform_probs`, which honours seeded requests), needed when any request samples;
    `generators` (request index -> generator) draw those requests' corrections."""
    device = target_logits.device
    counts = tuple(int(count) for count in num_draft_tokens)
    batch = DraftBatch.of(draft_token_ids.long(), _chain_parents(counts), counts, draft_probs)
    size, rows = batch.size, batch.rows
    parent_rows = batch.parent_rows  # target row i's place among the [N + B] rows
    top1, top2, z1, z2 = top_two(target_logits)  # exact in the logits' dtype; z1, z2 come back in float32
    theta = thresholds.per_request(greedy, temperature)[batch.request]
    low = (margin(z1, z2, thresholds.measure) > theta) & torch.isfinite(z2)

    def by_row(values: torch.Tensor) -> torch.Tensor:
        spread = values.new_zeros((rows, *values.shape[1:]))
        spread[parent_rows] = values
        return spread

    node_greedy = greedy[batch.request]
    ok, strict = greedy_choices(batch, by_row(top1), by_row(top2), by_row(low))
    residual = None
    if not bool(greedy.all()):
        if uniforms is None:
            raise ValueError("sampled requests need the rejection test's uniforms")
        p = by_row(torch.softmax(target_logits.float(), dim=-1))
        in_top_two = (batch.tokens == top1) | (batch.tokens == top2)
        ok_sampled, strict_sampled, residual = sampling_choices(batch, p, uniforms.to(p.dtype), in_top_two,
                                                                by_row(low))
        ok = torch.where(node_greedy, ok, ok_sampled)
        strict = torch.where(node_greedy, strict, strict_sampled)
    path, last_rows = accepted_paths(batch, first_sibling(ok, parent_rows))

    # the token after the path: the bonus past a request's last draft, else the correction at the
    # row whose child was rejected (its argmax, or a draw from what the rejections left)
    row_to_node = torch.full((rows,), -1, dtype=torch.long, device=device)
    row_to_node[parent_rows] = torch.arange(size, device=device)
    rejected_at = row_to_node[last_rows]
    past_last = rejected_at < 0
    request_greedy = greedy.to(device)
    correction = top1[rejected_at.clamp_min(0)] if size else torch.zeros_like(past_last, dtype=torch.long)
    if residual is not None:
        leftover = torch.where(past_last[:, None], torch.ones_like(residual[last_rows]), residual[last_rows])
        drawn = _draw(leftover.nan_to_num(nan=1.0).clamp_min(0.0), generators or {})
        correction = torch.where(request_greedy, correction, drawn)
    next_tokens = torch.where(past_last, bonus_token_ids.reshape(-1).long().to(device), correction)

    accepted = per_request(batch, path)
    output = torch.full((batch.requests, max(counts, default=0) + 1), PLACEHOLDER, dtype=torch.int32, device=device)
    slot = batch.node_rows - batch.root_rows[batch.request] - 1  # each draft's place in its chain
    output[batch.request[path], slot[path]] = batch.tokens[path].to(torch.int32)
    output[torch.arange(batch.requests, device=device), accepted] = next_tokens.to(torch.int32)
    examined = examined_rows(batch, path)
    return Outcome(output, accepted, per_request(batch, path & ~strict), per_request(batch, examined, by_row=True),
                   per_request(batch, by_row(low) & examined, by_row=True))


def _draw(probabilities: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """One token per row; a seeded request draws with its own generator, as vLLM does."""
    drawn = torch.multinomial(probabilities, 1)[:, 0]
    for index, generator in generators.items():
        drawn[index] = torch.multinomial(probabilities[index], 1, generator=generator)[0]
    return drawn
