"""Turning raw logits into the distribution we sample from (temperature, top-k, top-p).

Target and drafter logits go through the same processing, so that p and q in the rejection
sampling rule describe the same warped distribution, and the MARS margins are computed on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Below this temperature decoding is greedy. Sampling at T < 1e-4 is one-hot to float32 precision
# unless two logits lie within ~1e-3 of each other (then greedy takes the first), and far below it
# logits / T overflows float32 (1e-300 turns every logit into +-inf and softmax into NaN), so
# such a temperature means "greedy" and decodes as 0 does.
GREEDY_BELOW = 1e-4


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 (or anything below GREEDY_BELOW) means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1 disables

    @property
    def greedy(self) -> bool:
        """T = 0, or a temperature too small to divide by (see GREEDY_BELOW)."""
        return self.temperature < GREEDY_BELOW

    @property
    def order_only(self) -> bool:
        """Greedy with no top-k or top-p: every decision reads only the logits' order and top
        values, which any dtype holds exactly (no float32 copy of a [rows, V] tensor needed)."""
        return self.greedy and not self.top_k and self.top_p >= 1.0


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k and top-p to logits [..., V]; masked entries become -inf.

    When greedy (T below GREEDY_BELOW) the logits are returned unscaled (greedy decisions only
    need the order). Top-p always keeps each row's most likely token, however small p is.
    """
    logits = logits.float()
    if not params.greedy:
        logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # drop a token when the mass before it already reaches top_p (the top-1 always stays)
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
        # a p that float32 rounds to 0 (1e-300) would drop the top-1 too: it always stays
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probabilities(processed_logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(processed_logits, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of probs [..., V]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
