"""Collecting margins: the top-two raw logits (z1, z2) of the positions the target emits, grouped
by continuation, and the partial file that lets an interrupted collection resume.

Prompts are split into a fitting part and a held-out part (every fourth prompt); the held-out
positions check the fitted threshold on text it has not seen. The sampled mode cycles through
the prompts with a new seed per continuation; the greedy mode takes each prompt's greedy path once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from ..errors import UserError
from ..paths import write_atomic
from ..decoding.rules import top_two_values
from ..prompts import held_out

if TYPE_CHECKING:
    from ..session import Session

HELD_OUT_EVERY = 4


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


@dataclass
class MarginSample:
    """Top-two raw logits of the sampled positions, grouped by prompt (the bootstrap resamples
    whole groups: positions within a continuation are correlated)."""

    z1: list[torch.Tensor] = field(default_factory=list)
    z2: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def from_lists(cls, z1: Sequence[Sequence[float]], z2: Sequence[Sequence[float]]) -> MarginSample:
        """A sample from plain lists, one per group (a partial file, a sweep's strict runs)."""
        sample = cls()
        for a, b in zip(z1, z2):
            sample.add(torch.tensor(a, dtype=torch.float32), torch.tensor(b, dtype=torch.float32))
        return sample

    def add(self, z1: torch.Tensor, z2: torch.Tensor) -> None:
        self.z1.append(z1.float().cpu())
        self.z2.append(z2.float().cpu())

    def positions(self, groups: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = range(len(self.z1)) if groups is None else groups
        if not len(chosen):
            return torch.empty(0), torch.empty(0)
        return torch.cat([self.z1[g] for g in chosen]), torch.cat([self.z2[g] for g in chosen])

    def __len__(self) -> int:
        return sum(t.numel() for t in self.z1)


def split_prompts(count: int) -> tuple[list[int], list[int]]:
    """(fitting, held-out) prompt indices: every HELD_OUT_EVERY-th prompt is held out, and the
    last one when there are fewer, so the held-out check always has a prompt."""
    fitting, held = held_out(range(count), HELD_OUT_EVERY)
    if not held:
        fitting, held = fitting[:-1], fitting[-1:]
    return fitting, held


def collect(session: Session, prompts: list[str], indices: list[int], positions: int, seed: int,
            advance: Callable[[int], None], sample: MarginSample | None = None,
            checkpoint: Callable[[MarginSample], None] | None = None) -> MarginSample:
    """Sample continuations, cycling through `indices` (seed + call number each), until
    `positions` generated positions are collected; each continuation is one group. Passing a
    partial `sample` resumes exactly where it stopped (the call number is its group count);
    `checkpoint` is called after every continuation so an interrupted run loses at most one."""
    sample = sample if sample is not None else MarginSample()
    encoded = {i: session.encode(prompts[i]) for i in indices}
    call = len(sample.z1)
    advance(len(sample))
    while len(sample) < positions:
        index = indices[call % len(indices)]
        recorder = TopTwoRecorder()
        session.run(encoded[index], observe=recorder, seed=seed + call)
        call += 1
        room = positions - len(sample)
        z1, z2 = (values[:room] for values in recorder.values())
        sample.add(z1, z2)  # an empty group keeps the call count (and so the seeds) in step
        advance(z1.numel())
        if checkpoint is not None:
            checkpoint(sample)
    return sample


def collect_greedy(session: Session, prompts: list[str], indices: list[int], positions: int,
                   advance: Callable[[int], None]) -> MarginSample:
    """The greedy path of each prompt in `indices`, once (a greedy continuation never changes),
    until `positions` positions are collected or the prompts run out."""
    sample = MarginSample()
    for index in indices:
        if len(sample) >= positions:
            break
        recorder = TopTwoRecorder()
        session.run(session.encode(prompts[index]), observe=recorder)
        z1, z2 = (values[:positions - len(sample)] for values in recorder.values())
        sample.add(z1, z2)
        advance(z1.numel())
    return sample


def save_partial(path: Path, signature: dict, fit_sample: MarginSample, held_sample: MarginSample | None) -> None:
    """Collected logits so far, written atomically next to the profile."""
    def dump(sample: MarginSample | None) -> list | None:
        return None if sample is None else [[a.tolist(), b.tolist()] for a, b in zip(sample.z1, sample.z2)]

    write_atomic(path, json.dumps({"signature": signature, "fit": dump(fit_sample), "held": dump(held_sample)}))


def load_partial(path: Path, signature: dict) -> tuple[MarginSample, MarginSample | None]:
    """The (fit, held-out) samples of an interrupted run with the same options (`signature`)."""
    from ..inputs import LOG_LIMIT, read_text

    text = read_text(path, "resume file", LOG_LIMIT, missing=f"nothing to resume: {path} is missing")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise UserError(f"nothing to resume: {path} is not a calibration's resume file; rerun without --resume")
    if data.get("signature") != json.loads(json.dumps(signature)):
        raise UserError(f"--resume: the options differ from the interrupted run in {path}")

    def load(groups: object) -> MarginSample | None:
        if groups is None:
            return None
        try:  # [[z1 values, z2 values], ...], as save_partial writes them
            return MarginSample.from_lists([z1 for z1, _ in groups], [z2 for _, z2 in groups])  # type: ignore[union-attr]
        except (TypeError, ValueError, RuntimeError):
            raise UserError(f"nothing to resume: {path} is damaged (its positions are malformed); "
                            "rerun without --resume") from None

    return load(data.get("fit")) or MarginSample(), load(data.get("held"))
