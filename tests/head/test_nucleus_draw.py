"""Answering's sampler (head.data.NucleusDraw): the draw train-head's sampled answers are made of.

It must draw from exactly the distribution transformers' temperature + top-p sampling draws from
(`sampling.process_logits` states that nucleus), whether a row's nucleus lies within its top
candidates or reaches past them (then the row is sorted in full)."""

from __future__ import annotations

import json

import pytest
import torch

from mars_cli.decoding.sampling import SamplingParams, process_logits
from mars_cli.head.data import Answering, NucleusDraw, generate

DRAWS = 40_000


def frequencies(draw: NucleusDraw, logits: torch.Tensor) -> torch.Tensor:
    """How often each token came out of DRAWS calls' worth of rows of `logits`, as shares."""
    rows = logits.expand(DRAWS, -1)
    out = draw(None, rows)
    assert torch.isfinite(out).sum(dim=-1).eq(1).all()  # one finite token a row: greedy search emits it
    return torch.bincount(out.argmax(dim=-1), minlength=logits.shape[-1]).float() / DRAWS


@pytest.mark.parametrize("spread", [1.0, 4.0])  # a flat row reaches past 8 candidates, a peaked one not
def test_draws_follow_the_nucleus_distribution(spread):
    torch.manual_seed(7)
    logits = torch.randn(1, 40) * spread
    temperature, top_p = 0.8, 0.9
    expected = torch.softmax(process_logits(logits, SamplingParams(temperature, 0, top_p)), dim=-1)[0]
    draw = NucleusDraw(temperature, top_p, seed=3, candidates=8)
    seen = frequencies(draw, logits)
    outside = expected == 0
    assert seen[outside].sum() == 0  # never a token transformers' top-p drops
    assert (seen - expected).abs().max() < 0.015  # 40k draws: a share's sd is at most 0.0025
    nucleus = int((~outside).sum())
    assert (nucleus > 8) == (spread == 1.0)  # both paths are exercised


def test_the_top_token_always_stays():
    logits = torch.tensor([[5.0, 4.9, 0.0, -1.0]])
    seen = frequencies(NucleusDraw(1.0, 1e-6, seed=0), logits)
    assert seen.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_same_seed_same_draws_other_seed_other_draws():
    logits = torch.randn(64, 300)
    first, again, other = (NucleusDraw(1.0, 0.95, seed)(None, logits).argmax(-1) for seed in (5, 5, 6))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_sampled_answers_are_reproducible(tiny_target, tmp_path):
    prompts = [f"word {i}" for i in range(8)]
    answering = Answering(max_new_tokens=10, sampled_share=0.5, temperature=1.0, seed=4)
    runs = []
    for name in ("a.jsonl", "b.jsonl"):
        generate(tiny_target, prompts, tmp_path / name, answering, 4)
        runs.append({r["index"]: r["output_ids"] for r in map(json.loads, (tmp_path / name).open())})
    assert runs[0] == runs[1]
    sampled = [i for i in range(8) if answering.sampled(i)]
    assert sampled and all(len(runs[0][i]) > 0 for i in sampled)
