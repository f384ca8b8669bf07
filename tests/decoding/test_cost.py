"""The measured cost model: draft-length choice from a cost curve, the curve cache, the
per-round chooser of `--num-draft auto`, and `mars profile --widths`."""

from __future__ import annotations

import json

import math

import pytest
import torch

from mars_cli.decoding import cost
from mars_cli.tuning import curve, store
from mars_cli.tuning.choice import read
from mars_cli.decoding.controller import AdaptiveDraftLength, LiveCosts
from mars_cli.decoding.cost import CostCurve, best_draft_length, expected_tokens
from mars_cli.decoding.tree import DraftTree
from mars_cli.decoding.target import TargetScorer

STEEP = CostCurve({}, {w: 50.0 * w for w in range(1, 17)})  # every extra position costs a full step
FLAT = CostCurve({}, {w: 50.0 + 0.5 * w for w in range(1, 17)})  # widths nearly free (bfloat16 here)


def test_expected_tokens_is_one_plus_the_chain_of_acceptances():
    assert expected_tokens([0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([0.8], 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)  # the last rate carries on


def test_steep_widths_pick_a_short_draft_and_flat_widths_a_long_one():
    acceptance = [0.7] * 8
    assert best_draft_length(STEEP, acceptance, draft_ms=0.0, max_k=8) == 1
    assert best_draft_length(FLAT, acceptance, draft_ms=0.0, max_k=8) == 8
    # a dear drafter shortens the draft even on a flat curve
    assert best_draft_length(FLAT, acceptance, draft_ms=20.0, max_k=8) < 8


def test_uneven_curve_skips_dear_widths():
    """This CPU in float32: a width of 3 costs more than 5 (docs/benchmarks.md)."""
    uneven = CostCurve({}, {1: 54.0, 2: 87.3, 3: 112.2, 4: 85.3, 5: 70.2, 6: 75.3, 7: 93.8, 8: 74.6})
    assert best_draft_length(uneven, [0.6] * 8, draft_ms=0.0, max_k=7) in (4, 7)  # widths 5 or 8, never 3


def test_cost_between_and_past_measured_widths():
    curve = CostCurve({}, {1: 10.0, 4: 12.0, 8: 20.0})
    assert curve.cost(2) == 12.0  # the next wider measured width
    assert curve.cost(10) == pytest.approx(24.0)  # extrapolated from 4 -> 8


def test_chooser_learns_acceptance_and_shortens_for_a_poor_drafter():
    chooser = AdaptiveDraftLength(FLAT, max_k=8)
    assert chooser.choose(8) >= 6  # the prior: flat widths, decent acceptance: long drafts
    for _ in range(200):
        chooser.observe(drafted=8, accepted=0, draft_s=0.004)  # never accepted, 0.5 ms a token
    assert chooser.acceptance()[0] < 0.02
    assert chooser.choose(8) < 8
    assert chooser.choose(1) in (0, 1) and chooser.choose(0) == 0


def test_drafting_that_does_not_pay_is_switched_off_with_probes():
    """A captured GPU forward (2.4 ms, flat) against a drafter of 0.8 ms a token accepted 30% of
    the time (measured on the H200, docs/benchmarks.md): plain decoding wins, so auto stops
    drafting, yet a probe still drafts now and then (probe_interval) to keep measuring."""
    captured = CostCurve({}, {1: 2.33, 5: 2.40})
    assert best_draft_length(captured, [0.3] * 4, draft_ms=0.8, max_k=4, min_k=0) == 0
    assert best_draft_length(captured, [0.9] * 4, draft_ms=0.1, max_k=4, min_k=0) == 4  # a good, cheap drafter
    chooser = AdaptiveDraftLength(captured, max_k=4, lengths=(4,))
    assert chooser.choose(4) == 4  # nothing measured yet: the prior says draft
    for _ in range(50):
        chooser.observe(drafted=4, accepted=0 if _ % 3 else 1, draft_s=0.0032)
    # a probe costs 2.40 + 3.2 - 2.33 = 3.27 ms over a plain step: 0.5% of the time allows one in 281
    interval = chooser.probe_interval(4)
    assert interval == math.ceil(3.27 / (0.005 * 2.33))
    choices = [chooser.choose(4) for _ in range(3 * (interval + 1))]
    assert set(choices) == {0, 4}  # only the allowed lengths
    # a probe after every `interval` plain rounds, decided one round ahead (keep_features)
    assert [i for i, k in enumerate(choices) if k] == [interval, 2 * interval + 1, 3 * interval + 2]
    assert chooser.choose(0) == 0


def test_allowed_lengths_restrict_the_choice():
    assert best_draft_length(FLAT, [0.7] * 8, draft_ms=0.0, max_k=8, lengths=(2, 4)) == 4
    assert best_draft_length(STEEP, [0.7] * 8, draft_ms=0.0, max_k=8, min_k=0, lengths=(4,)) == 0


def test_a_corrupt_or_stale_cache_file_is_measured_again(tmp_path, monkeypatch, tiny_target):
    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    scorer = TargetScorer(tiny_target)
    measured = []
    original = curve.time_width_samples

    def counting(*args, **kwargs):
        measured.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(curve, "time_width_samples", counting)
    first = curve.curve_for(scorer, (1, 2, 3))
    assert sorted(first.ms_by_width) == [1, 2, 3] and len(measured) == 1
    assert curve.curve_for(scorer, (1, 2, 3)).ms_by_width == first.ms_by_width and len(measured) == 1  # cached
    path = store.cache_path(first.key, curve.FOLDER)
    for corrupt in ("{not json", json.dumps({"schema": cost.SCHEMA, "key": first.key, "ms_by_width": {"1": -3}}),
                    json.dumps({"schema": cost.SCHEMA, "key": {**first.key, "torch": "0.0"}, "ms_by_width": {"1": 5}})):
        path.write_text(corrupt)
        curve.curve_for(scorer, (1, 2, 3))
    assert len(measured) == 4  # never trusted: measured again each time
    assert read(curve.CurveMeasurement(scorer, (1, 2, 3))) is not None


def test_measuring_leaves_the_scorer_usable(tiny_target):
    scorer = TargetScorer(tiny_target)
    measured = curve.measure_curve(scorer, {}, widths=(1, 4), repeats=1, context=20)
    assert set(measured.ms_by_width) == {1, 4} and all(ms > 0 for ms in measured.ms_by_width.values())
    assert len(scorer.cache) == scorer.committed == 20
    with torch.inference_mode():
        assert scorer.score(torch.tensor([3]), DraftTree.chain(torch.tensor([4])), width=2).logits.shape[0] == 2


def test_tree_shape_takes_the_fewest_milliseconds_per_expected_token():
    from mars_cli.decoding.acceptance import EARLY_HEAD
    from mars_cli.decoding.cost import TREE_TOPK, tree_shape
    from mars_cli.decoding.tree import TreeShape

    tree_tau = EARLY_HEAD.tree

    assert tree_shape(STEEP) == TreeShape(1, 0)  # every extra position a full step: chains
    widths = (*range(1, 18), 25, 33, 49, 65)
    gentle = CostCurve({}, {w: 50.0 + 0.25 * w for w in widths})  # per token: 8 nodes 24.4, 16 22.9, 32 23.5
    assert tree_shape(gentle) == TreeShape(TREE_TOPK, 16)
    flat = CostCurve({}, {w: 50.0 for w in widths})  # width free: the largest tree that still gains
    assert tree_shape(flat) == TreeShape(TREE_TOPK, 32)
    # the curve that made the fixed 1.2x cap draft chains (Intel Xeon with AMX, bfloat16 packed):
    amx = CostCurve({}, {1: 34.3, 2: 37.8, 3: 37.8, 4: 43.0, 5: 43.0, 9: 41.3, 17: 43.8, 25: 46.9, 33: 51.2,
                         49: 58.2, 65: 68.4})
    assert tree_shape(amx) == TreeShape(TREE_TOPK, 16)
    float32 = CostCurve({}, {1: 40.8, 2: 43.9, 3: 43.5, 4: 57.1, 5: 58.3, 9: 68.4, 17: 74.9, 25: 82.1, 33: 118.0,
                             49: 113.2, 65: 150.0})  # the same CPU in float32: width is dear, chains
    assert tree_shape(float32) == TreeShape(1, 0)
    assert tree_tau(8) < tree_tau(12) < tree_tau(16) < tree_tau(24) < tree_tau(32) == tree_tau(64)
    compiled = CostCurve({}, {1: 2.4, 5: 2.4, 17: 2.5})  # a compiled curve: 17 is the only tree width
    assert tree_shape(compiled) == TreeShape(TREE_TOPK, 16)
    assert tree_shape(CostCurve({}, {1: 2.4, 5: 2.4})) == TreeShape(1, 0)  # never extrapolated


def test_tree_shape_weighs_trees_by_the_drafters_own_figures():
    """The curve measured on an AMD EPYC with AVX512-BF16 (bfloat16, packed): at an early head's
    figures chains look cheaper (the default drafted chains at 1.64x plain), at the step-13 head's
    measured ones the 4 x 8 tree wins (it ran at 1.80x)."""
    from mars_cli.decoding.acceptance import EARLY_HEAD, DraftAcceptance
    from mars_cli.decoding.cost import TREE_TOPK, tree_shape
    from mars_cli.decoding.tree import TreeShape

    epyc = CostCurve({}, {1: 36.2, 2: 36.7, 3: 47.5, 4: 46.0, 5: 46.0, 6: 46.8, 7: 47.6, 8: 42.2, 9: 50.7,
                          17: 63.3, 25: 67.3, 33: 84.0, 49: 91.4, 65: 126.8})
    assert tree_shape(epyc, EARLY_HEAD) == TreeShape(1, 0)
    step13 = DraftAcceptance(chain=(0.55, 0.52, 0.5, 0.45), tree_tau={8: 2.6, 16: 2.78, 32: 2.9}, source="test")
    assert tree_shape(epyc, step13) == TreeShape(TREE_TOPK, 8)
    weak = DraftAcceptance(chain=(0.3,), tree_tau={8: 1.2}, source="test")  # a poor drafter: no tree pays
    assert tree_shape(epyc, weak) == TreeShape(1, 0)


def test_a_round_without_a_drafting_time_teaches_acceptance_only():
    """The first round of a sequence reads the whole prompt into a head: its time says nothing
    about drafting, so `observe(..., None)` counts its acceptance but not its time."""
    chooser = AdaptiveDraftLength(FLAT, max_k=4)
    chooser.observe(4, 4, None)  # a prompt-reading round: 4 accepted, time not counted
    assert chooser.drafted == 0 and chooser.draft_s == 0.0 and chooser.accepted[:4] == [1, 1, 1, 1]
    chooser.observe(4, 1, 0.008)
    assert chooser.drafted == 4 and chooser.draft_s == 0.008


def test_drafting_cost_is_fitted_as_a_fixed_part_plus_a_part_per_token():
    """Rounds of 1 and 4 tokens costing 6 and 12 ms: 4 ms fixed + 2 ms a token, so 8 tokens are
    predicted at 20 ms (charging 6 ms a token, as one length alone would, says 48 ms)."""
    chooser = AdaptiveDraftLength(FLAT, max_k=8)
    chooser.observe(1, 1, 0.006)
    assert chooser.draft_cost_ms(8) == pytest.approx(48.0)  # one length seen: proportional
    for _ in range(3):
        chooser.observe(1, 0, 0.006)
        chooser.observe(4, 2, 0.012)
    assert chooser.draft_cost_ms(8) == pytest.approx(20.0)
    assert chooser.drafted == 4 * 1 + 3 * 4 and chooser.draft_s == pytest.approx(4 * 0.006 + 3 * 0.012)


def test_a_trees_drafting_time_belongs_to_the_depth_it_searched():
    chooser = AdaptiveDraftLength(FLAT, max_k=6, lengths=(6,))
    chooser.observe(3, 1, 0.012, timed_as=6)  # searched 6 levels; its best nodes reached depth 3
    chooser.observe(5, 4, 0.012, timed_as=6)
    assert chooser.time_by_k == {6: [0.024, 2]} and chooser.draft_cost_ms(6) == pytest.approx(12.0)
    assert chooser.examined[:5] == [2, 2, 1, 1, 1] and chooser.accepted[:4] == [2, 1, 1, 1]


def test_a_dear_drafter_that_is_asked_but_proposes_nothing_stops_being_asked():
    """A head below its confidence gate returns no draft but spent its time (4 ms against a 50 ms
    plain step): such rounds teach how often it proposes and what a miss costs, so the chooser
    turns drafting off (probing now and then) instead of paying every round."""
    chooser = AdaptiveDraftLength(FLAT, max_k=4)
    assert chooser.choose(4) > 0  # the prior says draft
    for _ in range(40):
        chooser.observe(0, 0, 0.004, asked=4)
    assert (chooser.empty_rounds, chooser.proposed_rounds) == (40, 0) and chooser.miss_ms() == pytest.approx(4.0)
    assert chooser.examined == [0, 0, 0, 0] and chooser.time_by_k == {}  # no acceptance or drafting time learnt
    assert chooser.propose_rate() < 0.05
    interval = chooser.probe_interval(chooser.choose(4) or 4)
    choices = [chooser.choose(4) for _ in range(2 * (interval + 1))]
    assert choices.count(0) == len(choices) - 2  # plain decoding, but for the probes
    chooser.observe(0, 0, None)  # a round that was not asked teaches nothing
    assert chooser.empty_rounds == 40


def test_a_free_drafter_that_often_misses_is_still_asked():
    """Prompt lookup finds no match in most rounds but costs nothing to ask, and when it matches
    its drafts stand: asking still pays, so the chooser keeps drafting."""
    chooser = AdaptiveDraftLength(FLAT, max_k=4)
    for round_ in range(60):
        if round_ % 4 == 0:
            chooser.observe(4, 3, 0.0001, asked=4)
        else:
            chooser.observe(0, 0, 0.0, asked=4)
    assert 0.2 < chooser.propose_rate() < 0.35
    assert chooser.choose(4) == 4


def test_the_miss_model_weighs_proposing_rounds_and_plain_ones():
    """With p = 0.5, a 4-token draft emitting 3 tokens at width 5 (52.5 ms) and a miss costing
    plain 50.5 + 10 ms: 2 tokens per 56.5 ms beats plain's 1 per 50.5 ms; at p = 0.05 (1.1 per 60.1) not."""
    assert best_draft_length(FLAT, [1.0, 1.0, 0.0, 0.0], draft_ms=0.0, max_k=4, min_k=0, lengths=(4,),
                             propose_rate=0.5, miss_ms=10.0) == 4
    assert best_draft_length(FLAT, [1.0, 1.0, 0.0, 0.0], draft_ms=0.0, max_k=4, min_k=0, lengths=(4,),
                             propose_rate=0.05, miss_ms=10.0) == 0


def test_probes_are_rarer_where_they_are_dear():
    """While drafting is off, probing costs at most PROBE_SHARE of the time: a probe costing a
    twenty-fifth of a plain step more comes after PROBE_EVERY plain rounds, one costing 60% more every 120."""
    cheap = AdaptiveDraftLength(CostCurve({}, {1: 50.0, 5: 52.0}), max_k=4, lengths=(4,))
    dear = AdaptiveDraftLength(CostCurve({}, {1: 50.0, 5: 80.0}), max_k=4, lengths=(4,))
    assert cheap.probe_interval(4) == AdaptiveDraftLength.PROBE_EVERY  # 2 ms extra: 8 rounds, but at least 16
    assert dear.probe_interval(4) == 120  # 30 ms extra / (0.5% of 50 ms)


def test_round_times_overrule_a_curve_that_is_wrong_here():
    """A cached curve taken at a busier moment (or on another CPU sold under the same name) says
    a 3-wide forward costs what a 1-wide one does: 60.7 vs 61.4 ms, the bfloat16 curve this
    project once found cached. This session's rounds time them at 34 and 55 ms. The curve is
    first scaled by width 1's live cost, then each width timed LIVE_MIN times stands on its own
    median, and drafting (half its first drafts accepted, 5 ms a token) is switched off."""
    wrong = CostCurve({}, {1: 60.7, 2: 100.3, 3: 61.4, 4: 74.1, 5: 87.2})
    chooser = AdaptiveDraftLength(wrong, max_k=2)
    for round_ in range(40):
        chooser.observe(2, round_ % 2, 0.010, asked=2)
    assert chooser.choose(2) == 2  # on the curve's word, a 3-wide forward is nearly free
    for _ in range(LiveCosts.LIVE_MIN):
        chooser.observe(0, 0, None, width=1, target_s=0.034)
    assert chooser.costs.cost(3) == pytest.approx(61.4 * 34 / 60.7)  # scaled, not yet timed itself
    for round_ in range(LiveCosts.LIVE_MIN):
        chooser.observe(2, round_ % 2, 0.010, asked=2, width=3, target_s=0.055)
    assert chooser.costs.cost(3) == pytest.approx(55.0)
    assert chooser.choose(2) == 0
    chooser.observe(0, 0, None, width=1, target_s=0.0)  # an untimed round (phase laps off) teaches nothing
    assert len(chooser.costs.timed[1]) == LiveCosts.LIVE_MIN


def test_speculative_estimate_picks_the_cheapest_shape_per_token():
    """k chain drafts accepted at rate a each bring 1 + a + ... + a^k tokens; a tree brings the
    tau its size's figure says."""
    from mars_cli.decoding.acceptance import DraftAcceptance

    figures = DraftAcceptance(chain=(0.5,), tree_tau={8: 1.8, 32: 1.9}, source="test")
    flat = CostCurve({}, {1: 10.0, 2: 10.0, 3: 10.0, 4: 10.0, 5: 10.0, **{n + 1: 11.0 for n in cost.TREE_SIZES}})
    ms, shape = cost.speculative_estimate(flat, figures)  # later positions at the last figure's rate
    assert shape == "a chain of 4" and ms == pytest.approx(10.0 / 1.9375)  # 11 ms / 1.9 is dearer
    better_trees = DraftAcceptance(chain=(0.5,), tree_tau={8: 2.4, 32: 2.62}, source="test")
    ms, shape = cost.speculative_estimate(flat, better_trees)  # 11 ms / 2.62 beats the chain's 10 ms / 1.94
    assert shape == "a 4 x 32 tree" and ms == pytest.approx(11.0 / 2.62)  # 32 nodes: as much as 64 brings
    steep = CostCurve({}, {1: 10.0, 2: 11.0, 3: 16.0, 4: 22.0, 5: 28.0, **{n + 1: 10.0 * n for n in cost.TREE_SIZES}})
    assert cost.speculative_estimate(steep, figures) == (pytest.approx(11.0 / 1.5), "a chain of 1")
    dear = CostCurve({}, {w: 10.0 * w for w in cost.ESTIMATE_WIDTHS})
    assert cost.speculative_estimate(dear, figures) == (10.0, "plain decoding")
    assert cost.speculative_estimate(flat)[0] < cost.speculative_estimate(dear)[0]  # the shipped defaults


def test_a_machine_that_slows_down_while_only_trees_run_keeps_drafting():
    """The cached curve was timed on a quiet machine (plain 50 ms, a 33-wide tree 56 ms). This
    session's tree rounds run 2x slower (112 ms) and no plain round has been timed: plain must be
    costed at this moment's speed (curve ratio x the trees' live cost: 100 ms), not the curve's
    quiet 50 ms, against which drafting at tau ~2 (14 ms a round) would look like a loss."""
    quiet = CostCurve({}, {1: 50.0, 33: 56.0})
    chooser = AdaptiveDraftLength(quiet, max_k=4, width=lambda k: 33)
    for _ in range(10):
        chooser.observe(4, 1, 0.014, asked=4, width=33, target_s=0.112)
    assert chooser.costs.cost(33) == pytest.approx(112.0)
    assert chooser.costs.cost(1) == pytest.approx(50.0 * 112.0 / 56.0)
    assert chooser.choose(4) > 0


def test_a_stale_width_moves_with_the_machine():
    """Plain rounds (50 ms) and trees (60 ms) timed together; then only trees, at 120 ms: the old
    plain median is moved by the trees' own change since (x2), not kept as it was. A width timed
    within the last STALE rounds stands on its own median."""
    live = LiveCosts(CostCurve({}, {1: 40.0, 33: 44.0}))
    for _ in range(4):
        live.observe(1, 50.0)
        live.observe(33, 60.0)
    assert live.cost(1) == pytest.approx(50.0) and live.cost(33) == pytest.approx(60.0)
    for _ in range(LiveCosts.STALE):
        live.observe(33, 120.0)
    assert live.cost(33) == pytest.approx(120.0)
    assert live.cost(1) == pytest.approx(50.0 * 120.0 / 60.0)
    for _ in range(LiveCosts.LIVE_MIN):  # plain rounds again: timed now, their own median counts
        live.observe(1, 90.0)
    assert live.cost(1) == pytest.approx(90.0)
    assert live.cost(33) == pytest.approx(120.0)  # still within the last STALE rounds


def test_one_slow_drafting_round_early_does_not_switch_drafting_off_for_good():
    """The first timed drafting round took 500 ms (the machine stalled) where drafting takes
    10 ms: drafting then looks dear and the chooser decodes plainly, but it probes again after
    PROBE_EVERY rounds, the next timing (the least of the few, then their median) shows the
    true cost, and drafting resumes. With a mean of the timings and a probe interval scaled by
    that cost it stayed off for the whole run."""
    curve = CostCurve({}, {w: 40.0 + 1.0 * w for w in range(1, 17)})
    chooser = AdaptiveDraftLength(curve, max_k=4)
    k = chooser.choose(4)
    assert k > 0
    chooser.observe(k, k, 0.5)  # all accepted, but the drafting took 500 ms
    choices = []
    for _ in range(120):
        k = chooser.choose(4)
        choices.append(k)
        if k:
            chooser.observe(k, k - 1, 0.0025 * k)
    assert choices[0] == 0  # dear at first sight
    assert choices.index(next(c for c in choices if c)) <= AdaptiveDraftLength.PROBE_EVERY + 1
    assert sum(c > 0 for c in choices[-60:]) >= 55  # drafting again: its typical time is 10 ms
    assert chooser.typical_draft_s(4) == pytest.approx(0.01)


def test_the_typical_drafting_time_is_the_least_of_a_few_then_their_median():
    chooser = AdaptiveDraftLength(FLAT, max_k=4)
    for seconds in (0.3, 0.01):
        chooser.observe(4, 1, seconds)
    assert chooser.typical_draft_s(4) == pytest.approx(0.01)
    assert chooser.draft_cost_ms(4) == pytest.approx(10.0)
    chooser.observe(4, 1, 0.02)
    assert chooser.typical_draft_s(4) == pytest.approx(0.02)  # the median of 0.3, 0.01, 0.02
    assert chooser.draft_s == pytest.approx(0.33)  # the totals still count every round
