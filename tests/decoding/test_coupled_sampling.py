"""Sampling with coupled noise (sampling.PositionNoise): every sampler of a sequence reads the same
Gumbel noise at each position, so strict verification at any temperature emits exactly what plain
sampling with the same seed emits, for every drafter, tree shape and draft length; the sampling
oracle, as temperature 0 has its greedy one."""

from __future__ import annotations

import random

import pytest
import torch

from mars_cli.decoding.drafters import ModelDrafter, NgramDrafter, NoDrafter
from mars_cli.decoding.sampling import PositionNoise, SamplingParams, coupled_sample, process_logits
from mars_cli.decoding.stats import DecodeStats
from mars_cli.decoding.tree import CHAIN, TreeShape
from mars_cli.decoding.verifiers import Verifier
from mars_cli.head.drafter import HeadDrafter

from ..head.test_head import random_head
from .test_loop import random_prompt
from ..trees import decode_all

SETTINGS = [SamplingParams(1.0), SamplingParams(0.7, top_p=0.9), SamplingParams(1.2, top_k=8)]


def test_noise_depends_on_seed_and_position_only():
    first, again = PositionNoise(5, 300), PositionNoise(5, 300)
    read_forwards = torch.stack([first.at(p) for p in range(4)])
    read_backwards = torch.stack([again.at(p) for p in reversed(range(4))]).flip(0)
    assert torch.equal(read_forwards, read_backwards)  # no dependence on what was drawn before
    assert not torch.equal(PositionNoise(6, 300).at(0), first.at(0))
    assert not torch.equal(first.at(0), first.at(1))
    assert not torch.equal(PositionNoise(1, 300).at(0), PositionNoise(0, 300).at(1))  # no seed + position collision
    assert torch.equal(first.rows([2], 200, "cpu")[0], first.at(2)[:200])
    padded = first.rows([2], 310, "cpu")[0]
    assert torch.equal(padded[:300], first.at(2)) and bool((padded[300:] == float("-inf")).all())


def test_gumbel_max_draws_follow_the_softmax():
    """Over 20,000 positions of one seed, argmax(logits + g) has the softmax's frequencies, and a
    masked token (top-k) is never drawn."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    processed = process_logits(logits, SamplingParams(0.8, top_k=5))
    p = torch.softmax(processed, dim=-1)
    draws = 20_000
    noise = PositionNoise(3, 6)
    tokens = coupled_sample(processed.expand(draws, 6), noise.rows(list(range(draws)), 6, "cpu"))
    frequencies = torch.bincount(tokens, minlength=6) / draws
    assert frequencies[5] == 0
    assert 0.5 * (frequencies - p).abs().sum() < 0.02


@pytest.mark.parametrize("sampling", SETTINGS, ids=["T1", "T0.7-top-p", "T1.2-top-k"])
@pytest.mark.parametrize("shape", [CHAIN, TreeShape(4, 8), TreeShape(3, 16)], ids=["chain", "4x8", "3x16"])
def test_every_drafter_and_shape_samples_what_plain_sampling_samples(tiny_target, tiny_draft, shape, sampling):
    """The sampling oracle: with the same seed, strict verification emits plain sampling's tokens
    token for token, whatever drafts (n-gram, head, draft model; chains and trees); MARS with a
    threshold nothing passes too."""
    rng = random.Random(5)
    vocab = len(tiny_target.tokenizer)
    head = random_head(tiny_target, seed=4)
    for seed, prompt in enumerate((random_prompt(rng, vocab, 9), random_prompt(rng, vocab, 21))):
        def sample_with(drafter, verifier, stats=None):
            noise = PositionNoise(seed, tiny_target.vocab_size)
            return decode_all(tiny_target, drafter, prompt, 20, verifier, 4, shape.tokens, noise, stats)

        expected = sample_with(NoDrafter(tiny_target.device), Verifier("strict", sampling=sampling))
        drafters = [NgramDrafter(tiny_target.device, shape), HeadDrafter(head, tiny_target, sampling, shape=shape),
                    ModelDrafter(tiny_draft, sampling, shape)]
        for drafter in drafters:
            for verifier in (Verifier("strict", sampling=sampling), Verifier("mars", 1.0, sampling=sampling)):
                stats = DecodeStats()
                assert sample_with(drafter, verifier, stats) == expected, (drafter.name, shape, verifier.rule)
                if drafter.name != "ngram":
                    assert stats.drafted > 0


def test_draft_length_does_not_change_what_is_sampled(tiny_target, tiny_draft):
    """However many tokens each round drafts (what `--num-draft auto` changes with its timings),
    the same seed emits the same tokens."""
    sampling = SamplingParams(0.9, top_p=0.95)
    prompt = random_prompt(random.Random(2), len(tiny_target.tokenizer), 12)
    verifier = Verifier("strict", sampling=sampling)
    outputs = {tuple(decode_all(tiny_target, ModelDrafter(tiny_draft, sampling), prompt, 24, verifier, k, 0,
                                PositionNoise(77, tiny_target.vocab_size))) for k in (1, 2, 3, 5)}
    assert len(outputs) == 1


def test_a_drafter_with_the_targets_distribution_is_always_accepted(tiny_target):
    """The drafter samples with the target's noise: a draft model equal to the target proposes the
    target's own draw at every position, so every draft stands (rejection sampling with
    independent draws would accept all of them too, but here the tokens are the very ones plain
    sampling emits)."""
    sampling = SamplingParams(1.0)
    prompt = random_prompt(random.Random(3), len(tiny_target.tokenizer), 10)
    stats = DecodeStats()
    verifier = Verifier("strict", sampling=sampling)
    tokens = decode_all(tiny_target, ModelDrafter(tiny_target, sampling), prompt, 30, verifier, 4, 0,
                        PositionNoise(9, tiny_target.vocab_size), stats)
    plain = decode_all(tiny_target, NoDrafter(tiny_target.device), prompt, 30, verifier, 4, 0,
                       PositionNoise(9, tiny_target.vocab_size))
    assert tokens == plain
    assert stats.drafted > 0 and stats.accepted == stats.drafted
