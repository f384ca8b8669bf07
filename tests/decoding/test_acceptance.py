"""A drafter's measured acceptance (decoding/acceptance.py): read from a head's config.json,
refused in one line when malformed, and what `--draft-topk auto` weighs trees by."""

from __future__ import annotations

import json

import pytest
import torch

from mars_cli.decoding import cost
from mars_cli.tuning import curve as tuning_curve
from mars_cli.decoding.acceptance import EARLY_HEAD, DraftAcceptance
from mars_cli.decoding.cost import TREE_TOPK, CostCurve
from mars_cli.decoding.tree import CHAIN, TreeShape
from mars_cli.errors import UserError
from mars_cli.head.drafter import head_acceptance, load_head
from mars_cli.options import DecodingOptions
from mars_cli.session import Session

from ..head.test_eagle3 import write_public_head

FIGURES = {"chain": [0.55, 0.52, 0.5, 0.45], "tree_tau": {"8": 2.6, "16": 2.78, "32": 2.9}}
# bfloat16 packed on an AMD EPYC with AVX512-BF16: width is dear, so the figures decide the shape
EPYC = CostCurve({}, {1: 36.2, 2: 36.7, 3: 47.5, 4: 46.0, 5: 46.0, 6: 46.8, 7: 47.6, 8: 42.2, 9: 50.7,
                      17: 63.3, 25: 67.3, 33: 84.0, 49: 91.4, 65: 126.8})


def test_figures_parse_and_trees_interpolate_in_log_size():
    figures = DraftAcceptance.from_json(FIGURES, "config.json", "test")
    assert figures.chain == (0.55, 0.52, 0.5, 0.45) and figures.tree_tau == {8: 2.6, 16: 2.78, 32: 2.9}
    assert figures.tree(4) == 2.6 and figures.tree(64) == 2.9  # no gain assumed past the largest
    assert 2.6 < figures.tree(12) < 2.78 and figures.tree(12) == pytest.approx(2.6 + 0.18 * 0.58496, abs=1e-4)
    assert DraftAcceptance.from_json(json.loads(json.dumps(figures.key())), "x", "y") == \
        DraftAcceptance(figures.chain, figures.tree_tau, "y")


@pytest.mark.parametrize("entry, message", [
    ([0.5], "expected an object"),
    ({"chain": [1.5], "tree_tau": {"8": 2.0}}, "`chain` must be"),
    ({"chain": [], "tree_tau": {"8": 2.0}}, "`chain` must be"),
    ({"chain": [True], "tree_tau": {"8": 2.0}}, "`chain` must be"),
    ({"chain": [float("nan")], "tree_tau": {"8": 2.0}}, "`chain` must be"),
    ({"chain": [0.5]}, "`tree_tau` must map"),
    ({"chain": [0.5], "tree_tau": {"eight": 2.0}}, "sizes must be whole numbers"),
    ({"chain": [0.5], "tree_tau": {"128": 2.0}}, "sizes must be whole numbers"),
    ({"chain": [0.5], "tree_tau": {"8": 10.0}}, "between 1 and 9"),
    ({"chain": [0.5], "tree_tau": {"8": 0.5}}, "between 1 and 9"),
])
def test_malformed_figures_are_one_line(entry, message):
    with pytest.raises(UserError, match=message) as raised:
        DraftAcceptance.from_json(entry, "head/config.json: `mars.acceptance`", "test")
    assert "\n" not in str(raised.value) and "mars.acceptance" in str(raised.value)


def test_a_head_carries_its_figures_and_a_malformed_entry_refuses_the_head(tiny_target, tmp_path):
    measured = write_public_head(tmp_path / "measured", tiny_target, config_changes={"mars": {"acceptance": FIGURES}})
    assert load_head(f"head:{measured}", tiny_target).acceptance.tree_tau == {8: 2.6, 16: 2.78, 32: 2.9}
    assert head_acceptance(measured).chain == (0.55, 0.52, 0.5, 0.45)
    plain = write_public_head(tmp_path / "plain", tiny_target)
    assert load_head(f"head:{plain}", tiny_target).acceptance is None and head_acceptance(plain) is None
    broken = write_public_head(tmp_path / "broken", tiny_target,
                               config_changes={"mars": {"acceptance": {"chain": [2], "tree_tau": {"8": 2}}}})
    with pytest.raises(UserError, match=r"mars\.acceptance.*`chain` must be"):
        load_head(f"head:{broken}", tiny_target)
    assert head_acceptance(broken) is None  # read without loading: the load says what is wrong


def _session_shape(directory, tiny_target) -> TreeShape:
    options = DecodingOptions.of(draft=f"head:{directory}", dtype="float32", packed_weights="off")
    return Session(options, target=tiny_target).drafter.shape


def test_tree_shape_auto_weighs_the_heads_own_figures(tiny_target, tmp_path, monkeypatch):
    """On the same measured curve, an early head's figures make chains look cheaper and the
    step-13 head's make a 4 x 8 tree win; the session takes the figures of the head it drafts with."""
    assert cost.tree_shape(EPYC, EARLY_HEAD) == CHAIN
    settled = CostCurve({}, EPYC.ms_by_width, frozenset(EPYC.ms_by_width))  # timed again already
    monkeypatch.setattr(tuning_curve, "curve_for", lambda *args, **kwargs: settled)
    shapes = {}
    for name, changes in (("measured", {"mars": {"acceptance": FIGURES}}), ("plain", None)):
        directory = write_public_head(tmp_path / name, tiny_target, config_changes=changes)
        shapes[name] = _session_shape(directory, tiny_target)
    assert shapes == {"measured": TreeShape(TREE_TOPK, 8), "plain": CHAIN}


def test_a_close_call_is_timed_again_before_the_session_takes_it(tiny_target, tmp_path, monkeypatch):
    """At an early head's figures the EPYC curve is a close call (chain 23.5 against tree 23.7 ms
    a token): the session times the deciding widths again (tuning.curve.settle) and takes what they say;
    a call far from close, or on settled widths, is taken as it is."""
    monkeypatch.setattr(tuning_curve, "curve_for", lambda *args, **kwargs: EPYC)
    asked = []

    def settle(scorer, curve, widths, budget=None, announce=True):
        asked.append(tuple(widths))
        return CostCurve({}, {**curve.ms_by_width, 1: 40.0, 5: 40.0, 9: 42.0}, frozenset(widths))

    monkeypatch.setattr(tuning_curve, "settle", settle)
    plain = write_public_head(tmp_path / "plain", tiny_target)
    assert _session_shape(plain, tiny_target) == TreeShape(TREE_TOPK, 8) and asked == [(1, 5, 9)]
    sure = {"chain": [0.5], "tree_tau": {"8": 3.5}}  # tree 14.5 against chain 23.8 ms a token: not close
    measured = write_public_head(tmp_path / "sure", tiny_target, config_changes={"mars": {"acceptance": sure}})
    assert _session_shape(measured, tiny_target) == TreeShape(TREE_TOPK, 8) and asked == [(1, 5, 9)]
    monkeypatch.setattr(tuning_curve, "curve_for", lambda *args, **kwargs: CostCurve({}, EPYC.ms_by_width, frozenset({1, 5, 9})))
    assert _session_shape(plain, tiny_target) == CHAIN and asked == [(1, 5, 9)]  # settled already: taken as it is


def test_a_fixed_topk_with_tokens_auto_gets_the_curves_best_tree_where_chains_win(tiny_target, tmp_path, monkeypatch):
    """`--draft-topk 2` with `--draft-tokens auto` on a curve that prefers chains: the user asked for
    a tree, so it is sized by the curve (its cheapest tree size), never 0 nodes (an IndexError in the
    tree search once), and a round decodes."""
    settled = CostCurve({}, EPYC.ms_by_width, frozenset(EPYC.ms_by_width))
    assert cost.tree_shape(settled, EARLY_HEAD) == CHAIN
    monkeypatch.setattr(tuning_curve, "curve_for", lambda *args, **kwargs: settled)
    plain = write_public_head(tmp_path / "plain", tiny_target)
    options = DecodingOptions.of(draft=f"head:{plain}", dtype="float32", packed_weights="off", draft_topk=2,
                                 max_new_tokens=6)
    session = Session(options, target=tiny_target)
    assert session.drafter.shape == TreeShape(2, cost.best_tree_size(settled, EARLY_HEAD))
    result = session.run([1, 2, 3, 4])
    assert 0 < len(result.token_ids) <= 6 and result.stats.tree_rounds > 0


def test_the_tree_search_keeps_nothing_when_asked_for_no_nodes():
    from mars_cli.decoding.tree import grow_tree

    root = torch.log_softmax(torch.randn(10, generator=torch.Generator().manual_seed(0)), -1)
    tree = grow_tree(root, lambda *args: pytest.fail("nothing to expand"), topk=2, depth=3, total=0, stop_early=True)
    assert tree.size == 0
