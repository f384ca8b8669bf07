"""Turning raw logits into the distribution we sample from (temperature, top-k, top-p).

Target and drafter logits go through the same processing, so that p and q in the rejection
sampling rule describe the same warped distribution, and the MARS margins are computed on it.
"""

from __future__ import annotations

import hashlib
import secrets
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


class PositionNoise:
    """Gumbel noise for each position of one sequence, fixed by a seed: the token sampled at
    position t is argmax(processed logits + g_t) (the Gumbel-max trick: exactly a draw from the
    softmax). Every sampler of a sequence reads the same g_t: the target in plain decoding, the
    verifier at each draft's position, a drafter drawing its chain. Strict verification then
    emits the very tokens plain sampling with the same seed emits, whatever was drafted and
    however long each round's draft was (the chooser's timings cannot change the output), and a
    drafter that samples with the same noise proposes the target's own draw where q and p agree.

    Each position's noise comes from its own generator, seeded from (seed, position), so it does
    not depend on how many numbers were drawn before it. The last few positions are kept: a
    round's drafter and verifier read the same ones."""

    KEPT = 64  # positions kept: a round reads at most depth + 1 of them

    def __init__(self, seed: int | None, vocab_size: int, device: torch.device | str = "cpu") -> None:
        self.seed = secrets.randbits(63) if seed is None else seed
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self._kept: dict[int, torch.Tensor] = {}

    def at(self, position: int) -> torch.Tensor:
        """g_t [V] (float32 on the noise's device)."""
        if position not in self._kept:
            if len(self._kept) >= self.KEPT:
                del self._kept[min(self._kept)]
            generator = torch.Generator(device=self.device).manual_seed(_mix(self.seed, position))
            uniform = torch.rand(self.vocab_size, generator=generator, device=self.device)
            self._kept[position] = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(torch.float32).tiny)))
        return self._kept[position]

    def rows(self, positions: list[int], width: int, device: torch.device | str) -> torch.Tensor:
        """[len(positions), width]: g_t of each position, cut or padded (with -inf: a token the
        noise's vocabulary lacks is never drawn) to a sampler's vocabulary width."""
        noise = torch.stack([self.at(p) for p in positions]) if positions else torch.empty(0, self.vocab_size)
        if width < self.vocab_size:
            noise = noise[:, :width]
        elif width > self.vocab_size:
            noise = torch.cat([noise, noise.new_full((noise.shape[0], width - self.vocab_size), float("-inf"))], dim=1)
        return noise.to(device)


def _mix(seed: int, position: int) -> int:
    """A 63-bit generator seed from (seed, position) with no simple collisions between pairs
    (seed 1 at position 0 and seed 0 at position 1 get unrelated noise)."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def coupled_sample(processed_logits: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax(processed logits + Gumbel noise) per row: a draw from softmax(processed logits)
    (masked -inf entries are never drawn), the same draw for the same noise."""
    return (processed_logits.float() + noise.to(processed_logits.device)).argmax(dim=-1)
