"""Per-round records and the metrics derived from them (tau, acceptance, time split)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from .tree import DraftTree
    from .verifiers import Verdict

PHASES = ("prefill", "draft", "target", "verify", "rollback", "other")


class PhaseClock:
    """Lap timer: each `lap(name)` charges the time since the previous lap to `name`.

    On CUDA it synchronises before reading the clock, so a phase is charged for its own kernels
    rather than for whoever next waits on them.
    """

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self._sync: Callable[[], None] | None = (
            (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
        )
        self.enabled = enabled
        self.totals: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.start = self._mark = time.perf_counter()

    def lap(self, phase: str) -> float:
        """Charge the time since the last lap to `phase` and return it. With `enabled=False`
        only the round boundary ("other") reads the clock (other laps return 0), which lets
        `mars profile` measure what the per-phase laps themselves cost."""
        if not self.enabled and phase != "other":
            return 0.0
        if self._sync is not None:
            self._sync()
        now = time.perf_counter()
        seconds = now - self._mark
        self.totals[phase] += seconds
        self._mark = now
        return seconds

    def exclude(self) -> None:
        """Leave out the time since the last lap (the consumer's, between rounds) entirely."""
        now = time.perf_counter()
        self.start += now - self._mark
        self._mark = now

    def elapsed(self) -> float:
        return self._mark - self.start


@dataclass
class DecodeStats:
    """Counters filled by the loop; every derived figure is computed in `summary`."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    relaxed: int = 0
    examined: int = 0  # draft positions the verification rule looked at
    low_margin: int = 0  # of those, positions that were low-margin (MARS only)
    drafted_at: list[int] = field(default_factory=list)  # per draft position (0-based)
    accepted_at: list[int] = field(default_factory=list)
    accepted_per_round: Counter = field(default_factory=Counter)
    widths: Counter = field(default_factory=Counter)  # target forwards by width fed (the prefill apart)
    round_ends: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, tokens so far)
    margins: list[float] = field(default_factory=list)
    tree_rounds: int = 0  # rounds that drafted a branching tree (not a chain)
    tree_nodes: int = 0  # nodes those trees had
    max_depth: int = 0  # deepest draft of any round
    sum_logprob: float = 0.0  # target log-probability of the emitted tokens (raw logits, T=1)
    phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    wall_s: float = 0.0
    finish_reason: str = ""

    def record(self, verdict: Verdict, tree: DraftTree, emitted: int, logprob: float = 0.0,
               margins: bool = True, width: int | None = None) -> None:
        """One round: the drafted `tree`, the `verdict` on it, the `emitted` tokens that stood
        (the accepted path and the target's own, cut at EOS or the budget) and their summed
        log-probability. Per-position acceptance is per depth: a chain's positions are its depths.
        `margins`: keep the verdict's margins (MARS) for the margin histogram; `width`: the
        positions the round's target forward fed (padding included), which its cost depends on."""
        accepted = min(len(verdict.accepted_positions), emitted)
        depth = tree.depth
        self.rounds += 1
        self.drafted += tree.size
        self.accepted += accepted
        self.new_tokens += emitted
        self.sum_logprob += logprob
        self.relaxed += verdict.relaxed
        self.examined += verdict.examined
        self.low_margin += verdict.low_margin
        if margins and verdict.margins is not None:
            self.margins.extend(verdict.margins.tolist())
        self.accepted_per_round[accepted] += 1
        self.widths[width if width is not None else tree.size + 1] += 1
        if not tree.is_chain():
            self.tree_rounds += 1
            self.tree_nodes += tree.size
        self.max_depth = max(self.max_depth, depth)
        self._grow(depth)
        for position in range(depth):
            self.drafted_at[position] += 1
        for position in range(accepted):
            self.accepted_at[position] += 1

    def end_round(self, elapsed_s: float) -> None:
        """Mark the end of a round on the decoding clock (tokens/s by output position)."""
        self.round_ends.append((elapsed_s, self.new_tokens))

    def merge(self, other: "DecodeStats") -> None:
        """Add `other` (a later sequence, e.g. the next turn of a conversation) into these
        counters: every count and time adds up, its round ends follow ours on the clock."""
        offset_s, offset_tokens = self.wall_s, self.new_tokens
        for name in ("prompt_tokens", "new_tokens", "rounds", "drafted", "accepted", "relaxed", "examined",
                     "low_margin", "sum_logprob", "wall_s", "tree_rounds", "tree_nodes"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self._grow(len(other.drafted_at))
        for position, (drafted, accepted) in enumerate(zip(other.drafted_at, other.accepted_at)):
            self.drafted_at[position] += drafted
            self.accepted_at[position] += accepted
        self.accepted_per_round.update(other.accepted_per_round)
        self.widths.update(other.widths)
        self.max_depth = max(self.max_depth, other.max_depth)
        self.round_ends.extend((offset_s + t, offset_tokens + n) for t, n in other.round_ends)
        self.margins.extend(other.margins)
        for phase, seconds in other.phase_s.items():
            self.phase_s[phase] = self.phase_s.get(phase, 0.0) + seconds
        self.finish_reason = other.finish_reason or self.finish_reason

    def _grow(self, positions: int) -> None:
        grow = positions - len(self.drafted_at)
        if grow > 0:
            self.drafted_at.extend([0] * grow)
            self.accepted_at.extend([0] * grow)

    def summary(self) -> dict[str, object]:
        """The contract's `stats` object."""
        wall = self.wall_s or float("nan")
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "tokens_per_s": self.new_tokens / wall if self.wall_s else 0.0,
            "wall_s": self.wall_s,
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "relaxed": self.relaxed,
            "mean_accepted": self.new_tokens / self.rounds if self.rounds else 0.0,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "per_position_acceptance": [
                a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)
            ],
            "low_margin_share": self.low_margin / self.examined if self.examined else 0.0,
            "margins": [round(m, 5) for m in self.margins],  # MARS: margins of the examined positions
            "mean_logprob": self.sum_logprob / self.new_tokens if self.new_tokens else 0.0,
            "accepted_length_histogram": {str(k): v for k, v in sorted(self.accepted_per_round.items())},
            "forwards_by_width": {str(w): n for w, n in sorted(self.widths.items())},
            "tree": {"rounds": self.tree_rounds, "mean_nodes": self.tree_nodes / self.tree_rounds,
                     "max_depth": self.max_depth} if self.tree_rounds else None,
            "time_s": dict(self.phase_s),
            "finish_reason": self.finish_reason,
        }
