"""The scorer and the cache: `keep` for prefixes and for gathered rows, feature selection,
and the hand-off of exactly the kept rows' features."""

from __future__ import annotations

import pytest
import torch

from mars_cli.decoding.kv import KVCache
from mars_cli.decoding.stats import DecodeStats
from mars_cli.decoding.target import LAST_LAYER, TargetScorer, select_features
from mars_cli.decoding.tree import DraftTree
from mars_cli.decoding.verifiers import Verdict

PREFIX = [5, 9, 14, 20, 7]


def fresh_cache(target, tokens: list[int]) -> KVCache:
    cache = KVCache(target.model)
    cache.forward(torch.tensor([tokens]))
    return cache


def assert_same_cache(a: KVCache, b: KVCache) -> None:
    assert len(a) == len(b)
    for left, right in zip(a.cache.layers, b.cache.layers):
        torch.testing.assert_close(left.keys, right.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(left.values, right.values, rtol=1e-5, atol=1e-5)


def next_logits(target, cache: KVCache, token: int) -> torch.Tensor:
    return cache.forward(torch.tensor([[token]])).logits[0, -1]


@torch.inference_mode()
def test_keep_a_prefix_crops(tiny_target):
    cache = fresh_cache(tiny_target, PREFIX + [3, 4, 6])
    cache.keep(range(len(PREFIX) + 1))
    reference = fresh_cache(tiny_target, PREFIX + [3])
    assert_same_cache(cache, reference)
    torch.testing.assert_close(next_logits(tiny_target, cache, 8), next_logits(tiny_target, reference, 8))


@torch.inference_mode()
def test_keep_gathers_a_branch_of_a_tree(tiny_target):
    """Feed a after the prefix, then two siblings b and c (both children of a, at the same
    depth): keeping a and c must leave the cache a fresh forward over prefix + a + c would."""
    cache = fresh_cache(tiny_target, PREFIX)
    p = len(PREFIX)
    a, b, c = 3, 4, 6
    allowed = torch.ones(3, p + 3, dtype=torch.bool)
    allowed[0, p + 1 :] = False  # a sees the prefix and itself
    allowed[1, p + 2] = False  # b sees a and itself
    allowed[2, p + 1] = False  # c sees a and itself, not its sibling b
    mask = torch.zeros(1, 1, 3, p + 3, dtype=tiny_target.dtype)
    mask.masked_fill_(~allowed, torch.finfo(tiny_target.dtype).min)
    cache.forward(torch.tensor([[a, b, c]]), attention_mask=mask, position_ids=torch.tensor([[p, p + 1, p + 1]]))

    cache.keep(list(range(p)) + [p, p + 2])
    reference = fresh_cache(tiny_target, PREFIX + [a, c])
    assert_same_cache(cache, reference)
    torch.testing.assert_close(next_logits(tiny_target, cache, 8), next_logits(tiny_target, reference, 8))


@torch.inference_mode()
def test_keep_refuses_to_gather_layers_without_rows(tiny_target):
    """A layer that stores no per-position rows (linear attention) cannot gather: a named error,
    while a prefix (a crop) still works."""
    from mars_cli.decoding.kv import CacheGatherUnsupported

    cache = fresh_cache(tiny_target, PREFIX)
    cache.cache.layers[-1].keys = None  # what a linear-attention layer looks like to the gather
    with pytest.raises(CacheGatherUnsupported, match="cannot gather rows"):
        cache.keep([0, 1, 3])


@torch.inference_mode()
def test_keep_refuses_positions_outside_the_cache(tiny_target):
    cache = fresh_cache(tiny_target, PREFIX)
    with pytest.raises(ValueError):
        cache.keep([0, 1, 7])


def test_select_features_picks_and_concatenates_layers():
    states = tuple(torch.full((1, 2, 3), float(i)) for i in range(5))
    assert torch.equal(select_features(states, LAST_LAYER), states[-1])
    both = select_features(states, (2, -1))
    assert both.shape == (1, 2, 6)
    assert torch.equal(both[..., :3], states[2]) and torch.equal(both[..., 3:], states[4])
    with pytest.raises(ValueError):
        select_features(states, ())


@torch.inference_mode()
def test_scorer_hands_over_the_features_of_the_kept_rows(tiny_target):
    scorer = TargetScorer(tiny_target, LAST_LAYER)
    prefill = scorer.start(torch.tensor(PREFIX[:-1]))
    assert prefill.shape[0] == len(PREFIX) - 1
    scored = scorer.score(torch.tensor(PREFIX[-1:]), DraftTree.chain(torch.tensor([3, 4])), width=5)  # padded to 5
    assert scored.logits.shape[0] == 3 and scored.features.shape[0] == 3
    kept = scorer.keep([0, 1])
    torch.testing.assert_close(kept, scored.features[:2])
    assert len(scorer.cache) == scorer.committed == len(PREFIX) + 1
    # the kept rows' features equal a fresh pass over the same tokens
    output = tiny_target.model(input_ids=torch.tensor([PREFIX + [3]]), output_hidden_states=True)
    torch.testing.assert_close(kept, select_features(output.hidden_states, LAST_LAYER)[0, -2:], rtol=1e-5, atol=1e-5)


def test_scorer_without_feature_layers_returns_none(tiny_target):
    scorer = TargetScorer(tiny_target)
    assert scorer.start(torch.tensor(PREFIX[:-1])) is None
    scored = scorer.score(torch.tensor(PREFIX[-1:]), DraftTree.chain(torch.tensor([3])), width=2)
    assert scored.features is None and scorer.keep([0]) is None


def chain(n: int) -> DraftTree:
    return DraftTree.chain(torch.arange(3, 3 + n))


def verdict(accepted: list[int], relaxed: int, examined: int, low: int, margins: list[float] | None) -> Verdict:
    return Verdict(accepted, 0, relaxed, examined, low, None if margins is None else torch.tensor(margins))


def test_stats_merge_adds_every_counter():
    first, second = DecodeStats(), DecodeStats()
    first.record(verdict([0, 1], 1, 3, 1, [0.95, 0.5, 0.2]), chain(4), 3, -1.5)
    first.wall_s, first.phase_s["target"] = 1.0, 0.8
    first.end_round(1.0)
    second.record(verdict([0, 1], 0, 2, 2, [0.97, 0.99]), chain(2), 3, -0.5)
    second.end_round(0.5)
    second.record(verdict([], 0, 1, 0, None), chain(6), 1, -0.25)
    second.end_round(2.0)
    second.wall_s, second.phase_s["target"] = 2.0, 1.5
    second.finish_reason = "eos"
    first.merge(second)
    assert (first.rounds, first.drafted, first.accepted, first.new_tokens) == (3, 12, 4, 7)
    assert (first.relaxed, first.examined, first.low_margin) == (1, 6, 3)
    assert first.margins == pytest.approx([0.95, 0.5, 0.2, 0.97, 0.99])
    assert first.sum_logprob == pytest.approx(-2.25)
    assert first.drafted_at == [3, 3, 2, 2, 1, 1] and first.accepted_at == [2, 2, 0, 0, 0, 0]
    assert first.accepted_per_round == {2: 2, 0: 1}
    assert first.wall_s == 3.0 and first.phase_s["target"] == pytest.approx(2.3)
    assert first.round_ends == [(1.0, 3), (1.5, 6), (3.0, 7)]
    assert first.finish_reason == "eos"
    assert first.summary()["low_margin_share"] == pytest.approx(0.5)


def test_a_prompt_computes_its_last_rows_logits_only(tiny_target, monkeypatch):
    """Nobody reads a prompt's logits: transformers' forward is asked for the last row's only
    (an 8,150-token prompt's logits once took 1.6 GB), and the steps after it get every row's."""
    seen = []
    original = tiny_target.model.forward

    def recording(*args, **kwargs):
        output = original(*args, **kwargs)
        seen.append((kwargs.get("logits_to_keep"), output.logits.shape[1]))
        return output

    monkeypatch.setattr(tiny_target.model, "forward", recording)
    scorer = TargetScorer(tiny_target)
    scorer.start(torch.arange(3, 23))
    scored = scorer.score(torch.tensor([5]), DraftTree(tokens=torch.tensor([6, 7]), parents=torch.tensor([-1, 0])),
                          width=3)
    assert seen[0] == (1, 1) and scored.logits.shape[0] == 3 and seen[-1][0] is None
