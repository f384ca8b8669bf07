"""Rounds that do not draft cost a plain step (issue 26): while the chooser has drafting off, a
round asks the target for no hidden states and the head does not run; the few rounds before a
probe keep the features the probe's head reads; the head then reads the pairs it was given."""

from __future__ import annotations

import random
from collections import Counter

import torch

from mars_cli.decoding.controller import AdaptiveDraftLength
from mars_cli.decoding.cost import CostCurve
from mars_cli.decoding.loop import DecodeSettings, decode
from mars_cli.decoding.sampling import SamplingParams
from mars_cli.decoding.stats import DecodeStats
from mars_cli.decoding.target import TargetScorer
from mars_cli.decoding.verifiers import Verifier
from mars_cli.head.drafter import HeadDrafter, load_head
from mars_cli.head.model import HeadCache

from ..head.test_eagle3 import aux_features, write_public_head
from .test_loop import hf_greedy, random_prompt

STEEP = CostCurve({}, {w: 50.0 * w for w in range(1, 20)})  # a k-token draft costs k + 1 plain steps


def test_plain_rounds_ask_no_hidden_states_and_run_no_head(tiny_target, tmp_path, monkeypatch):
    """Spies on the target's forwards (was `output_hidden_states` asked?) and on the head's steps,
    round by round, with drafting off (a steep cost curve) and a probe every 17th round."""
    head = load_head(f"head:{write_public_head(tmp_path / 'head', tiny_target, seed=1)}", tiny_target)
    drafter = HeadDrafter(head, tiny_target, SamplingParams(0.0))
    chooser = AdaptiveDraftLength(STEEP, max_k=3)
    monkeypatch.setattr(chooser, "PROBE_SHARE", 1.0)  # probes after PROBE_EVERY plain rounds
    monkeypatch.setattr(chooser.costs, "observe", lambda width, ms: None)  # the curve decides, not timings
    prompt = random_prompt(random.Random(3), len(tiny_target.tokenizer), 9)
    max_new = 60

    current = [0]  # the round running (0: the prefill)
    asked_hidden: dict[int, bool] = {}
    head_steps: Counter = Counter()
    real_step = head.step

    def counting_step(*args, **kwargs):
        head_steps[current[0]] += 1
        return real_step(*args, **kwargs)

    def record_forward(module, args, kwargs):
        asked_hidden[current[0]] = bool(kwargs.get("output_hidden_states"))

    monkeypatch.setattr(head, "step", counting_step)
    hook = tiny_target.model.register_forward_pre_hook(record_forward, with_kwargs=True)
    stats = DecodeStats()
    drafted_in: set[int] = set()
    tokens: list[int] = []
    try:
        scorer = TargetScorer(tiny_target, drafter.feature_layers)
        settings = DecodeSettings(max_new, 3, adaptive_draft=True, ignore_eos=True)
        rounds = decode(scorer, drafter, Verifier("strict"), prompt, settings, None, stats, draft_length=chooser)
        before = 0
        current[0] = 1  # the prefill runs with round 1, before its forward
        for chunk in rounds:
            if stats.drafted > before:
                drafted_in.add(current[0])
            before = stats.drafted
            tokens.extend(chunk)
            current[0] += 1
    finally:
        hook.remove()

    assert tokens == hf_greedy(tiny_target, prompt, max_new, eos=None)  # still the target's own text
    last = stats.rounds
    assert drafted_in and len(drafted_in) <= 4 and last > 40  # mostly plain, a few probes
    lead = chooser.FEATURE_LEAD
    for round_ in range(1, last - lead):  # (the last rounds' probes never come)
        keeps = any(round_ + ahead in drafted_in for ahead in range(lead + 1))  # a draft now or within `lead`
        assert asked_hidden[round_] == keeps, round_
        if round_ not in drafted_in:
            assert head_steps[round_] == 0, round_
        else:
            assert head_steps[round_] > 0, round_
    assert sum(not asked_hidden[r] for r in range(1, last)) >= last - (lead + 2) * len(drafted_in) - 1


def test_the_rounds_before_a_probe_know_it():
    """`keep_features` is False on every plain round but the FEATURE_LEAD before a probe, and
    `defer` moves a draft the drafter cannot make to the next round."""
    chooser = AdaptiveDraftLength(STEEP, max_k=3)
    lead = chooser.FEATURE_LEAD
    choices, keeps = [], []
    for _ in range(700):  # a probe after each ~200 plain rounds (0.5% of the time, at 2 steps each)
        choices.append(chooser.choose(3))
        keeps.append(chooser.keep_features())
    probes = [i for i, k in enumerate(choices) if k]
    assert len(probes) >= 3 and all(choices[i - 1] == 0 for i in probes)
    for i in range(len(choices) - lead):
        assert keeps[i] == any(choices[i + ahead] > 0 for ahead in range(lead + 1)), i
    assert sum(keeps[: probes[-1] + 1]) == (lead + 1) * len(probes)  # each probe and the lead before it
    chooser.defer()
    assert chooser.keep_features() and chooser.choose(3) > 0


def test_after_skipped_rounds_the_head_reads_the_pairs_it_was_given(tiny_target, tmp_path):
    """The head's cache lacks the pairs of positions that came without features: its chain equals
    a from-scratch drafting over exactly the pairs it was given (positions compressed, as its
    cache holds them). Without the last position's features it proposes nothing."""
    head = load_head(f"head:{write_public_head(tmp_path / 'head', tiny_target, seed=2)}", tiny_target)
    ids = random_prompt(random.Random(7), len(tiny_target.tokenizer), 20)
    features = aux_features(tiny_target, ids, head)
    drafter = HeadDrafter(head, tiny_target, SamplingParams(0.0))
    drafter.observe_features(features[:8])  # the prefill: positions 0-7
    drafter.skip_features(5)  # five plain rounds: positions 8-12 without features
    drafter.observe_features(features[13:15])  # the round before a probe, then its kept row
    proposed = drafter.propose(torch.tensor(ids[:16]), 3).tokens.tolist()

    held = [*range(8), 13, 14]
    recomputed: list[int] = []
    with torch.no_grad():
        cache = HeadCache()
        state = head.step(features[held], torch.tensor([ids[p + 1] for p in held]), cache)[-1:]
        for _ in range(3):
            token = int(head.vocab_ids[head.logits(state[0]).argmax()])
            recomputed.append(token)
            state = head.step(state, torch.tensor([token]), cache)
    assert proposed == recomputed and len(proposed) == 3

    drafter.commit(15)
    drafter.skip_features(1)
    assert drafter.propose(torch.tensor(ids[:17]), 3).size == 0  # the newest position has no features
