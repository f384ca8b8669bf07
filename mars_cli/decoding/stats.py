"""Per-round records and the metrics derived from them (tau, acceptance, time split)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

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

    def lap(self, phase: str) -> None:
        """With `enabled=False` only the round boundary ("other") reads the clock, which lets
        `mars profile` measure what the per-phase laps themselves cost."""
        if not self.enabled and phase != "other":
            return
        if self._sync is not None:
            self._sync()
        now = time.perf_counter()
        self.totals[phase] += now - self._mark
        self._mark = now

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
    round_ends: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, tokens so far)
    margins: list[float] = field(default_factory=list)
    sum_logprob: float = 0.0  # target log-probability of the emitted tokens (raw logits, T=1)
    phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    wall_s: float = 0.0
    finish_reason: str = ""

    def record_round(self, drafted: int, accepted: int, emitted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.new_tokens += emitted
        self.accepted_per_round[accepted] += 1
        grow = drafted - len(self.drafted_at)
        if grow > 0:
            self.drafted_at.extend([0] * grow)
            self.accepted_at.extend([0] * grow)
        for position in range(drafted):
            self.drafted_at[position] += 1
        for position in range(accepted):
            self.accepted_at[position] += 1

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
            "time_s": dict(self.phase_s),
            "finish_reason": self.finish_reason,
        }
