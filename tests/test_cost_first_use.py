"""A cost curve's first use (issue 24, item 4): bounded, measured only at the widths a session
reads, measured by one process at a time, and never a traceback from the cache. No timing decides
a test: forwards are counted on a fake scorer whose clock the test drives."""

from __future__ import annotations

import fcntl
import json
import os
import threading

import pytest
import torch

from mars_cli import models, notes
from mars_cli.decoding import cost
from mars_cli.decoding.cost import Budget, CostCurve


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeTarget:
    fingerprint = "fake-model"
    device = torch.device("cpu")
    dtype = torch.float32
    vocab_size = 64
    model = torch.nn.Linear(2, 2)  # dense: nothing here packs it (mars_cli/packing.py)


class FakeScorer:
    """Counts the forwards by width; each advances the fake clock by `seconds(width)`."""

    compiled = False

    def __init__(self, clock: FakeClock, seconds=lambda width: 1.0, wait: threading.Event | None = None) -> None:
        self.target, self.clock, self.seconds, self.wait = FakeTarget(), clock, seconds, wait
        self.forwards: list[int] = []
        self.started = threading.Event()

    def start(self, context: torch.Tensor) -> None:
        self.started.set()  # measuring: the lock is held
        self.clock.now += 0.5  # the prefill

    def score(self, pending: torch.Tensor, tree, width: int) -> None:
        if self.wait is not None:  # hold the lock until the other thread waits for it
            assert self.wait.wait(timeout=20)
            self.wait = None
        self.forwards.append(width)
        self.clock.now += self.seconds(width)

    def rewind(self, length: int) -> None:
        pass


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch) -> None:
    """Notes said `once` per process: each test sees its own."""
    monkeypatch.setattr(notes, "_SHOWN", set())


@pytest.fixture
def clock(monkeypatch, tmp_path) -> FakeClock:
    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    fake = FakeClock()
    monkeypatch.setattr(cost, "_now", fake)
    return fake


def test_first_use_is_bounded_and_later_uses_measure_the_rest(clock):
    """The issue's case: 21 widths x (1 warm-up + 5 repeats) took over 200 s. Now a first use
    stops after its budget (one forward may overrun it), keeps what it measured and caches it;
    the next use measures only the widths still missing."""
    scorer = FakeScorer(clock, seconds=lambda width: 1.0)
    curve = cost.curve_for(scorer, cost.DEFAULT_WIDTHS, budget=Budget(10.0))
    assert clock.now <= 10.0 + 1.0
    assert len(scorer.forwards) <= 10 and scorer.forwards[0] == 1
    measured = set(curve.ms_by_width)
    assert 1 in measured and measured <= set(scorer.forwards) and len(measured) < len(cost.DEFAULT_WIDTHS)
    assert all(curve.ms_by_width[width] == pytest.approx(1000.0) for width in measured)  # 1 s each
    assert cost.load_cached(curve.key).ms_by_width == curve.ms_by_width  # what was measured is kept

    again = FakeScorer(clock)
    refined = cost.curve_for(again, cost.DEFAULT_WIDTHS, budget=Budget(10.0))
    assert not set(again.forwards) & set(curve.ms_by_width)  # nothing measured twice
    assert set(refined.ms_by_width) > set(curve.ms_by_width)


def test_a_spent_budget_measures_nothing_more(clock):
    scorer = FakeScorer(clock)
    budget = Budget(3.0)
    first = cost.curve_for(scorer, (1, 9), budget=budget)
    assert set(first.ms_by_width) == {1, 9} and budget.seconds <= 0
    count = len(scorer.forwards)
    second = cost.curve_for(scorer, range(1, 10), known=first, budget=budget)
    assert len(scorer.forwards) == count and second.ms_by_width == first.ms_by_width


def test_a_prefill_that_spends_the_budget_leaves_one_forward(clock):
    """On a loaded machine the 200-token prefill alone may outlast the budget: then width 1 is
    timed once (the prefill warmed it up) and nothing else is measured."""
    scorer = FakeScorer(clock)
    curve = cost.curve_for(scorer, cost.SHAPE_WIDTHS, budget=Budget(0.4))  # the fake prefill takes 0.5 s
    assert scorer.forwards == [1] and set(curve.ms_by_width) == {1}


def test_the_measuring_note_says_what_is_measured(clock):
    said: list[str] = []
    cost.curve_for(FakeScorer(clock), cost.shape_widths(False), note=said.append, budget=Budget(100.0))
    assert said == ["measuring the target's forward cost at widths 1, 9, 17, 25, 33, 49, 65 (once per model, "
                    "device and dtype, at most 100 s; cached)"]


@pytest.mark.parametrize("topk, expected", [
    (1, [tuple(range(1, 10))]),  # a chain: widths 1 .. max_draft + 1 only
    ("auto", [cost.SHAPE_WIDTHS]),  # the shape first; then a chain's or the tree's widths, if missing
])
def test_a_session_measures_only_the_widths_it_reads(monkeypatch, tmp_path, tiny_target, topk, expected):
    from mars_cli.options import DecodingOptions
    from mars_cli.session import Session

    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    asked: list[tuple[int, ...]] = []
    original = cost.measure_curve

    def recording(scorer, key, widths, repeats, **kwargs):
        asked.append(tuple(widths))
        return original(scorer, key, widths, 1, context=20)

    monkeypatch.setattr(cost, "measure_curve", recording)
    session = Session(DecodingOptions.of(draft="ngram", draft_topk=topk, max_new_tokens=4), target=tiny_target)
    session.run([4, 5, 6, 4, 5])
    assert asked[: len(expected)] == expected
    if topk == "auto" and session.tree.topk > 1:  # a tree: its width is one of the shape's, measured already
        assert len(asked) == 1
    elif topk == "auto":  # a chain after the shape: only the chain widths the shape did not measure
        assert asked[1:] == [(2, 3, 4, 5, 6, 7, 8)]
    else:
        assert len(asked) == 1


def test_two_first_uses_at_once_measure_once(clock):
    """The second process (here a thread: flock locks conflict between open files) waits for the
    first's curve and reads it: it measures nothing."""
    second_waits = threading.Event()
    first = FakeScorer(clock, wait=second_waits)
    second = FakeScorer(clock)
    results: dict[str, CostCurve] = {}
    said: list[str] = []

    def run_first() -> None:
        results["first"] = cost.curve_for(first, (1, 9, 17), budget=Budget(100.0))

    def waiting_note(text: str) -> None:
        said.append(text)
        if "waiting" in text:
            second_waits.set()

    thread = threading.Thread(target=run_first)
    thread.start()
    assert first.started.wait(timeout=20)  # the first holds the lock; its first forward waits for the second
    results["second"] = cost.curve_for(second, (1, 9, 17), note=waiting_note, budget=Budget(100.0))
    thread.join(timeout=30)
    assert second.forwards == [] and len(first.forwards) > 0
    assert results["second"].ms_by_width == results["first"].ms_by_width
    assert any("another mars process is measuring" in line for line in said)


def _lock_path(scorer: FakeScorer) -> str:
    target = scorer.target
    key = cost.curve_key(target.fingerprint, target.device, target.dtype, False, cost.CONTEXT_TOKENS)
    return str(cost.cache_path(key)) + ".lock"


def test_a_wait_that_runs_out_decodes_with_a_default_curve(clock, monkeypatch, capsys):
    monkeypatch.setattr(cost, "LOCK_WAIT_S", 0.0)
    scorer = FakeScorer(clock)
    path = _lock_path(scorer)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        known = CostCurve({}, {1: 40.0})
        curve = cost.curve_for(scorer, cost.SHAPE_WIDTHS, known=known, budget=Budget(100.0))
    assert scorer.forwards == []  # width 1 was known: nothing measured under the other's load
    assert curve.ms_by_width[1] == 40.0 and all(w in curve.ms_by_width for w in range(1, 66))
    assert cost.tree_shape(curve).topk == 1  # the default: chains
    assert cost.load_cached(curve.key) is None  # never cached
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "decoding with a default curve" in lines[0]


def _unwritable(kind: str, cache) -> None:
    costs = cache / "costs"
    if kind == "entry-directory":
        costs.mkdir(parents=True)
        key = cost.curve_key(FakeTarget.fingerprint, FakeTarget.device, FakeTarget.dtype, False, cost.CONTEXT_TOKENS)
        cost.cache_path(key).mkdir()
    elif kind == "costs-file":
        cache.mkdir(parents=True)
        costs.write_text("not a directory")
    else:
        costs.mkdir(parents=True)
        costs.chmod(0o500)


def _refuse_writes_as_root(costs, monkeypatch) -> None:
    """Root writes into a 0500 directory: make it immutable instead (EPERM for root too), or,
    where chattr is missing, have the cache's temporary file refused as the kernel would."""
    import subprocess

    if os.geteuid() != 0:
        return
    if subprocess.run(["chattr", "+i", str(costs)], capture_output=True).returncode != 0:
        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr("mars_cli.paths.tempfile.mkstemp", refuse)


@pytest.mark.parametrize("kind", ["entry-directory", "costs-file", "read-only-costs"])
def test_an_unwritable_cache_decodes_uncached_with_one_note(clock, tmp_path, capsys, kind, monkeypatch):
    _unwritable(kind, tmp_path / "cache")
    if kind == "read-only-costs":
        _refuse_writes_as_root(tmp_path / "cache" / "costs", monkeypatch)
    scorer = FakeScorer(clock)
    curve = cost.curve_for(scorer, (1, 9), budget=Budget(100.0))
    curve = cost.curve_for(scorer, range(1, 10), known=curve, budget=Budget(100.0))  # the chain's widths
    assert set(curve.ms_by_width) == set(range(1, 10))
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "cannot cache the cost curve" in lines[0] and "decoding without" in lines[0]
    if kind == "read-only-costs":  # let pytest clean up
        import subprocess

        subprocess.run(["chattr", "-i", str(tmp_path / "cache" / "costs")], capture_output=True)
        (tmp_path / "cache" / "costs").chmod(0o700)


@pytest.mark.parametrize("kind", ["entry-directory", "costs-file"])
def test_generate_with_an_unwritable_cost_cache(monkeypatch, capsys, tmp_path, tiny_dir, kind):
    """The issue's case end to end: the default generate decodes, says so in one note, exit 0."""
    from mars_cli.cli import main

    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    cache = tmp_path / "cache"
    (cache / "costs").parent.mkdir(parents=True, exist_ok=True)
    if kind == "costs-file":
        (cache / "costs").write_text("")
    else:  # every entry this run could write is a directory: make `costs` hold one per key
        monkeypatch.setattr(cost, "cache_path", lambda key: cache / "costs" / "entry.json")
        (cache / "costs" / "entry.json").mkdir(parents=True)
    code = main(["generate", "abc abc", "--target", str(tiny_dir), "-n", "4", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err
    assert err.count("cannot cache the cost curve") == 1


@pytest.mark.parametrize("absurd", [
    {w: 1e-9 for w in cost.SHAPE_WIDTHS},
    {w: 1e9 for w in cost.SHAPE_WIDTHS},
    {1: 50.0, 9: 1e-5, 17: 5e6, 25: 60.0, 33: 61.0, 49: 62.0, 65: 63.0},  # non-monotone nonsense
])
def test_absurd_cached_costs_are_measured_again(clock, absurd):
    scorer = FakeScorer(clock, seconds=lambda width: 0.05 + 0.001 * width)
    key = cost.curve_key(FakeTarget.fingerprint, FakeTarget.device, FakeTarget.dtype, False, cost.CONTEXT_TOKENS)
    path = cost.cache_path(key)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema": cost.SCHEMA, "key": key,
                                "ms_by_width": {str(w): ms for w, ms in absurd.items()}}))
    curve = cost.curve_for(scorer, cost.SHAPE_WIDTHS, budget=Budget(100.0))
    kept = {w for w, ms in absurd.items() if 1e-3 <= ms <= 6e4 and 0.1 <= ms / absurd[1] <= 1000}
    assert set(scorer.forwards) == set(cost.SHAPE_WIDTHS) - kept  # what is implausible is measured again
    assert all(cost.MIN_PLAUSIBLE_MS <= ms <= 1000 for ms in curve.ms_by_width.values())


def test_interpolation_and_shape_with_few_widths():
    """A partial curve (a bounded first use): tree_shape reads only measured tree widths; between
    measured widths a chain costs the next wider measured one."""
    partial = CostCurve({}, {1: 50.0, 9: 55.0, 17: 80.0})
    assert cost.tree_shape(partial) == cost.TreeShape(cost.TREE_TOPK, 8)
    assert partial.cost(4) == 55.0 and partial.cost(12) == 80.0


def test_bfloat16_without_native_instructions_claims_nothing_false(monkeypatch, capsys):
    """On this AVX2 CPU bfloat16 plain decoding ran 1.45x faster than float32: the old warning
    ("runs emulated (slower than float32)") was false here."""
    monkeypatch.setattr(models, "cpu_computes_bfloat16", lambda: False)
    assert models.resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "slower than float32" not in lines[0] and "emulated" not in lines[0]
    assert "may be slower or faster than float32" in lines[0] and "mars profile --dtypes" in lines[0]


def test_a_close_chain_or_tree_call_is_timed_again_once_and_cached(clock):
    """An early head's figures on a noisy curve: chain 23.5 against tree 23.7 ms a token, within
    SHAPE_CLOSE. The deciding widths (1, the chain's 5, the tree's 9) are timed again together,
    SETTLE_REPEATS each, and their medians decide (here the tree), marked settled and cached."""
    from mars_cli.decoding.acceptance import EARLY_HEAD
    from mars_cli.decoding.tree import CHAIN, TreeShape

    scorer = FakeScorer(clock, seconds=lambda width: {1: 0.040, 5: 0.040, 9: 0.042}.get(width, 0.05))
    target = scorer.target
    key = cost.curve_key(target.fingerprint, target.device, target.dtype, False, cost.CONTEXT_TOKENS)
    noisy = CostCurve(key, {1: 36.2, 2: 36.7, 3: 47.5, 4: 46.0, 5: 46.0, 9: 50.7, 17: 63.3})
    verdict = cost.shape_verdict(noisy, EARLY_HEAD)
    assert verdict.shape == CHAIN and verdict.closeness < cost.SHAPE_CLOSE and verdict.deciding == (1, 5, 9)
    settled = cost.settle(scorer, noisy, verdict.deciding, Budget(10.0))
    assert sorted(set(scorer.forwards)) == [1, 5, 9]
    assert all(scorer.forwards.count(w) == 1 + cost.SETTLE_REPEATS for w in (1, 5, 9))  # a warm-up, then timed
    assert settled.ms_by_width[9] == pytest.approx(42.0) and settled.ms_by_width[17] == 63.3
    assert settled.settled == {1, 5, 9} and cost.load_cached(key).settled == {1, 5, 9}
    assert cost.shape_verdict(settled, EARLY_HEAD).shape == TreeShape(cost.TREE_TOPK, 8)
    again = cost.curve_for(scorer, (1, 5, 9, 17))  # the next session reads the settled widths back
    assert again.settled == {1, 5, 9} and again.ms_by_width[9] == pytest.approx(42.0)
    scorer.forwards.clear()
    assert cost.settle(scorer, noisy, (1, 5, 9), Budget(0.0)) is noisy and scorer.forwards == []  # budget spent


def test_a_settling_cut_short_is_not_cached(clock):
    scorer = FakeScorer(clock, seconds=lambda width: 1.0)
    target = scorer.target
    key = cost.curve_key(target.fingerprint, target.device, target.dtype, False, cost.CONTEXT_TOKENS)
    noisy = CostCurve(key, {1: 40.0, 5: 46.0, 9: 50.0})
    partial = cost.settle(scorer, noisy, (1, 5, 9), Budget(4.0))
    assert partial.settled == frozenset() and cost.load_cached(key) is None  # a later run settles them
