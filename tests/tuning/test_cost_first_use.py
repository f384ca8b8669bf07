"""A cost curve's first use (issue 24, item 4): bounded by the process's measuring budget
(mars_cli/tuning/clock.py), measured only at the widths a session reads, measured by one process
at a time, and never a traceback from the cache (mars_cli/tuning/curve.py on choice.py's
protocol). No timing decides a test: forwards are counted on a fake scorer whose clock the test
drives."""

from __future__ import annotations

import fcntl
import json
import os
import threading

import pytest
import torch

from mars_cli import models, notes
from mars_cli.decoding import cost
from mars_cli.decoding.cost import CostCurve
from mars_cli.tuning import choice, store
from mars_cli.tuning import clock as tuning_clock
from mars_cli.tuning import curve as tuning_curve
from mars_cli.tuning.choice import read


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
    model = torch.nn.Linear(2, 2)  # dense: nothing here packs it (mars_cli/decoding/packing.py `installed`)


class FakeScorer:
    """Counts the forwards by width; each advances the fake clock by `seconds(width)` (`calls`:
    the prefill's and each forward's start and end on that clock)."""

    compiled = False

    def __init__(self, clock: FakeClock, seconds=lambda width: 1.0, wait: threading.Event | None = None) -> None:
        self.target, self.clock, self.seconds, self.wait = FakeTarget(), clock, seconds, wait
        self.forwards: list[int] = []
        self.calls: list[tuple[int | str, float, float]] = []
        self.started = threading.Event()

    def start(self, context: torch.Tensor) -> None:
        self.started.set()  # measuring: the lock is held
        begun = self.clock.now
        self.clock.now += 0.5  # the prefill
        self.calls.append(("prefill", begun, self.clock.now))

    def score(self, pending: torch.Tensor, tree, width: int) -> None:
        if self.wait is not None:  # hold the lock until the other thread waits for it
            assert self.wait.wait(timeout=20)
            self.wait = None
        self.forwards.append(width)
        begun = self.clock.now
        self.clock.now += self.seconds(width)
        self.calls.append((width, begun, self.clock.now))

    def rewind(self, length: int) -> None:
        pass


def _entry(scorer: FakeScorer, widths=cost.SHAPE_WIDTHS):
    """The fake scorer's cost curve entry as the cache holds it (choice.read), or None."""
    return read(tuning_curve.CurveMeasurement(scorer, widths))


def _entry_path(scorer: FakeScorer):
    return store.cache_path(tuning_curve.scorer_key(scorer), tuning_curve.FOLDER)


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch) -> None:
    """Notes said `once` per process: each test sees its own."""
    monkeypatch.setattr(notes, "_SHOWN", set())


@pytest.fixture
def clock(monkeypatch, tmp_path) -> FakeClock:
    """The measuring clock (mars_cli/tuning/clock.py `now`), driven by the fake scorers' forwards;
    the process's budget is conftest's fresh one (10 s of this clock) unless a test sets another."""
    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    fake = FakeClock()
    monkeypatch.setattr(tuning_clock, "now", fake)
    return fake


def test_first_use_is_bounded_and_later_uses_measure_the_rest(clock, capsys):
    """The issue's case: 21 widths x (1 warm-up + 5 repeats) took over 200 s. Now a first use
    stops before the process's budget is spent (no forward starts that its width's last call says
    would end past it), keeps what it measured and caches it, provisional; the next (quiet) run
    measures only the widths still missing."""
    scorer = FakeScorer(clock, seconds=lambda width: 1.0)
    curve = tuning_curve.curve_for(scorer, cost.DEFAULT_WIDTHS)
    # the prefill (0.5 s), then widths 1-4 warmed up and timed once each (8.5 s); width 5's warm-up
    # ends at 9.5 s, and its timing, 1 s by that warm-up, would end past the 10 s: not started
    assert scorer.forwards == [1, 1, 2, 2, 3, 3, 4, 4, 5] and clock.now == pytest.approx(9.5)
    assert clock.now < tuning_clock.PROCESS_BUDGET_S and tuning_clock.BUDGET.left == pytest.approx(0.5)
    measured = set(curve.ms_by_width)
    assert measured == {1, 2, 3, 4} and len(measured) < len(cost.DEFAULT_WIDTHS)  # width 5: warmed up only
    assert all(curve.ms_by_width[width] == pytest.approx(1000.0) for width in measured)  # 1 s each
    cached = _entry(scorer, cost.DEFAULT_WIDTHS)
    assert cached.curve.ms_by_width == curve.ms_by_width  # what was measured is kept ...
    assert "ran out of its budget" in cached.provenance.provisional  # ... as a provisional entry
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "the target's forward cost at widths 1-" in lines[0] and "provisional (" in lines[0]

    again = FakeScorer(clock)  # a later process: a budget of its own
    refined = tuning_curve.curve_for(again, cost.DEFAULT_WIDTHS, budget=tuning_clock.Budget())
    assert again.forwards and not set(again.forwards) & set(curve.ms_by_width)  # nothing measured twice
    assert set(refined.ms_by_width) > set(curve.ms_by_width)
    assert _entry(again, cost.DEFAULT_WIDTHS).curve.ms_by_width == refined.ms_by_width


@pytest.mark.parametrize("seconds", [3.0, 4.0])
def test_a_first_use_with_slow_forwards_stops_before_the_budget(clock, seconds):
    """Under load a first call spent 24 s. Now no forward starts that its width's last call (its
    warm-up, then its last timing) says would end past the deadline, and nothing starts once the
    deadline has passed: only a call with nothing to go by, the prefill or a width's first call
    (its warm-up), can end past it, and then by no more than itself. With 3 s forwards the first
    use stops before the budget: width 1 timed once, width 9 warmed up at 9.5 s, and its timing
    (3 s by that warm-up) never started."""
    scorer = FakeScorer(clock, seconds=lambda width: seconds)
    deadline = clock.now + tuning_clock.PROCESS_BUDGET_S
    curve = tuning_curve.curve_for(scorer, cost.SHAPE_WIDTHS)
    last: dict[int | str, float] = {}
    for what, start, end in scorer.calls:
        assert start < deadline  # nothing starts once the deadline has passed
        if what in last:  # a call its width's last one foretells: it ends by the deadline
            assert start + last[what] < deadline and end <= deadline
        last[what] = end - start
    past = [(what, start, end) for what, start, end in scorer.calls if end > deadline]
    assert len(past) <= 1 and clock.now == scorer.calls[-1][2]  # nothing after the one that ran past
    if past:  # by no more than that unforeseeable call: a width's first, a warm-up
        what, start, end = past[0]
        assert scorer.forwards.count(what) == 1 and clock.now - deadline <= end - start
    assert set(curve.ms_by_width) == {1} and curve.ms_by_width[1] == pytest.approx(seconds * 1000)
    if seconds == 3.0:  # each call here ends before the deadline: the budget is kept with time left
        assert scorer.forwards == [1, 1, 9] and clock.now == pytest.approx(9.5) and clock.now < deadline
        assert not tuning_clock.BUDGET.spent and tuning_clock.BUDGET.left == pytest.approx(0.5)
    cached = _entry(scorer)
    assert cached.curve.ms_by_width == curve.ms_by_width and "ran out of its budget" in cached.provenance.provisional


def test_a_first_use_cut_short_goes_on_up_to_quiet_attempts_then_waits(clock, monkeypatch):
    """A curve cut short on a quiet machine is measured on (its missing widths) by the next runs,
    up to choice.QUIET_ATTEMPTS in a row; then it is used as it is until choice.RETRY_AFTER_S
    have passed."""
    wall = [1_000_000.0]
    monkeypatch.setattr(tuning_clock, "wall", lambda: wall[0])
    measured: list[set[int]] = []  # the widths each run timed (a width it only warmed up is not)
    for run in range(choice.QUIET_ATTEMPTS):  # each a process with its own budget
        scorer = FakeScorer(clock)
        curve = tuning_curve.curve_for(scorer, cost.DEFAULT_WIDTHS, budget=tuning_clock.Budget())
        assert scorer.forwards and not set(scorer.forwards) & set().union(*measured)  # nothing timed twice
        measured.append(set(curve.ms_by_width) - set().union(*measured))
        assert measured[-1] and measured[-1] <= set(scorer.forwards)  # each run times widths of its own
        assert set(curve.ms_by_width) == set().union(*measured)
        cached = _entry(scorer, cost.DEFAULT_WIDTHS)
        assert cached.provenance.provisional is not None and cached.provenance.attempts == run + 1
    resting = FakeScorer(clock)
    curve = tuning_curve.curve_for(resting, cost.DEFAULT_WIDTHS, budget=tuning_clock.Budget())
    assert resting.forwards == [] and set(curve.ms_by_width) == set().union(*measured)  # as it is
    wall[0] += choice.RETRY_AFTER_S
    later = FakeScorer(clock)
    curve = tuning_curve.curve_for(later, cost.DEFAULT_WIDTHS, budget=tuning_clock.Budget())
    assert later.forwards and not set(later.forwards) & set().union(*measured)
    assert set(curve.ms_by_width) > set().union(*measured)


def test_a_spent_budget_measures_nothing_more(clock, monkeypatch):
    """The budget is the process's, over all its measuring: once spent, a wider use of the curve
    (the chain's widths after the shape's) measures nothing, whatever the provisional entry says."""
    monkeypatch.setattr(tuning_clock, "BUDGET", tuning_clock.Budget(3.0))
    scorer = FakeScorer(clock)
    first = tuning_curve.curve_for(scorer, (1, 9))
    # the prefill, width 1 warmed up and timed (2.5 s); width 9's warm-up, guessed at width 1's
    # second, would end past 3 s: not started
    assert scorer.forwards == [1, 1] and set(first.ms_by_width) == {1} and not tuning_clock.BUDGET.spent
    second = tuning_curve.curve_for(scorer, range(1, 10), known=first)  # the prefill spends the rest
    assert scorer.forwards == [1, 1] and clock.now == 3.0 and tuning_clock.BUDGET.spent
    count, at = len(scorer.forwards), clock.now
    third = tuning_curve.curve_for(scorer, range(1, 10), known=second)
    assert len(scorer.forwards) == count and clock.now == at  # not even a prefill
    assert second.ms_by_width == first.ms_by_width == third.ms_by_width


def test_a_prefill_that_spends_the_budget_times_nothing(clock, monkeypatch, capsys):
    """On a loaded machine the 200-token prefill alone may outlast the budget: then no forward is
    timed at all; the session decodes on the stand-in curve (default_curve at DEFAULT_PLAIN_MS, no
    plain step being known), provisional, and a later run on a quiet machine measures."""
    monkeypatch.setattr(tuning_clock, "BUDGET", tuning_clock.Budget(0.4))  # the fake prefill takes 0.5 s
    scorer = FakeScorer(clock)
    curve = tuning_curve.curve_for(scorer, cost.SHAPE_WIDTHS)
    assert scorer.forwards == [] and [call[0] for call in scorer.calls] == ["prefill"]
    assert clock.now == pytest.approx(0.5) and tuning_clock.BUDGET.spent
    stand_in = tuning_curve.default_curve(curve.key, tuning_curve.DEFAULT_PLAIN_MS)
    assert curve.ms_by_width == stand_in.ms_by_width and cost.tree_shape(curve).topk == 1  # chains
    cached = _entry(scorer)
    assert "ran out of its budget" in cached.provenance.provisional and not cached.provenance.busy
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "provisional (the measuring ran out of its budget" in lines[0]

    later = FakeScorer(clock, seconds=lambda width: 0.1)  # a later process, quiet: a budget of its own
    measured = tuning_curve.curve_for(later, cost.SHAPE_WIDTHS, budget=tuning_clock.Budget())
    assert set(later.forwards) == set(cost.SHAPE_WIDTHS)  # the stand-in's figures are no measurement
    assert all(measured.ms_by_width[width] == pytest.approx(100.0) for width in cost.SHAPE_WIDTHS)
    assert _entry(later).provenance.provisional is None and _entry(later).curve.ms_by_width == measured.ms_by_width


def test_the_measuring_note_says_what_was_measured(clock, capsys):
    """One note, after measuring: the widths, what width 1 and the widest cost, and that it is
    measured once and cached (the whole curve fitted in the process's budget)."""
    tuning_curve.curve_for(FakeScorer(clock, seconds=lambda width: 0.040 + 0.001 * width), cost.shape_widths(False))
    assert capsys.readouterr().err.strip().splitlines() == [
        "mars: note: the target's forward cost at widths 1, 9, 17, 25, 33, 49, 65: 41.0 ms at width 1, 105.0 at 65; "
        "measured once per model, device, dtype and compile mode, then cached"]


@pytest.mark.parametrize("topk, expected", [
    (1, [tuple(range(1, 10))]),  # a chain: widths 1 .. max_draft + 1 only
    ("auto", [cost.SHAPE_WIDTHS]),  # the shape first; then a chain's or the tree's widths, if missing
])
def test_a_session_measures_only_the_widths_it_reads(monkeypatch, tmp_path, tiny_target, topk, expected):
    from mars_cli.options import DecodingOptions
    from mars_cli.session import Session

    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    asked: list[tuple[int, ...]] = []
    original = tuning_curve.time_width_samples

    def recording(scorer, widths, repeats, deadline, context=tuning_curve.CONTEXT_TOKENS):
        if repeats != tuning_curve.SETTLE_REPEATS:  # a close chain-or-tree call timed again is no first use
            asked.append(tuple(widths))
        return original(scorer, widths, repeats, deadline, context=20)  # the tiny model's context is short

    monkeypatch.setattr(tuning_curve, "time_width_samples", recording)
    session = Session(DecodingOptions.of(draft="ngram", draft_topk=topk, max_new_tokens=4), target=tiny_target)
    session.run([4, 5, 6, 4, 5])
    assert asked[: len(expected)] == expected
    if topk == "auto" and session.tree.topk > 1:  # a tree: its width is one of the shape's, measured already
        assert len(asked) == 1
    elif topk == "auto":  # a chain after the shape: only the chain widths the shape did not measure
        assert asked[1:] == [(2, 3, 4, 5, 6, 7, 8)]
    else:
        assert len(asked) == 1


def test_two_first_uses_at_once_measure_once(clock, monkeypatch):
    """The second process (here a thread: flock locks conflict between open files; each with a
    budget of its own, as two processes have) waits for the first's curve and reads it: it
    measures nothing."""
    second_waits = threading.Event()
    first = FakeScorer(clock, seconds=lambda width: 0.1, wait=second_waits)  # the whole curve fits its budget
    second = FakeScorer(clock, seconds=lambda width: 0.1)
    results: dict[str, CostCurve] = {}
    said: list[str] = []
    note = notes.note

    def watching(text: str, **kwargs) -> None:
        said.append(text)
        if "waiting" in text:
            second_waits.set()
        note(text, **kwargs)

    monkeypatch.setattr(notes, "note", watching)

    def run_first() -> None:
        results["first"] = tuning_curve.curve_for(first, (1, 9, 17), budget=tuning_clock.Budget())

    thread = threading.Thread(target=run_first)
    thread.start()
    assert first.started.wait(timeout=20)  # the first holds the lock; its first forward waits for the second
    results["second"] = tuning_curve.curve_for(second, (1, 9, 17), budget=tuning_clock.Budget())
    thread.join(timeout=30)
    assert second.forwards == [] and len(first.forwards) > 0
    assert results["second"].ms_by_width == results["first"].ms_by_width
    assert any("another mars process is running the cost curve measurement; waiting" in line for line in said)
    assert _entry(first, (1, 9, 17)).provenance.provisional is None  # the first's, complete: settled


@pytest.mark.parametrize("short", ["lock-wait", "spent-budget"])
def test_a_wait_that_runs_out_decodes_with_a_default_curve(clock, monkeypatch, capsys, short):
    """Another process holds the entry's lock: this one waits at most choice.LOCK_WAIT_S, and never
    past what is left of its budget; then it decodes with a default curve, provisional, unsaved."""
    if short == "lock-wait":
        monkeypatch.setattr(choice, "LOCK_WAIT_S", 0.0)
    else:
        monkeypatch.setattr(tuning_clock, "BUDGET", tuning_clock.Budget(0.0))
    scorer = FakeScorer(clock)
    path = str(_entry_path(scorer)) + ".lock"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        known = CostCurve({}, {1: 40.0})
        curve = tuning_curve.curve_for(scorer, cost.SHAPE_WIDTHS, known=known)
    assert scorer.forwards == []  # width 1 was known: nothing measured under the other's load
    assert curve.ms_by_width[1] == 40.0 and all(w in curve.ms_by_width for w in range(1, 66))
    assert curve.ms_by_width == tuning_curve.default_curve(curve.key, 40.0).ms_by_width
    assert cost.tree_shape(curve).topk == 1  # the default: chains
    assert _entry(scorer) is None and not _entry_path(scorer).exists()  # never cached
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "provisional (another mars process was still measuring it)" in lines[0]


def _unwritable(kind: str, cache) -> None:
    costs = cache / tuning_curve.FOLDER
    if kind == "entry-directory":
        costs.mkdir(parents=True)
        _entry_path(FakeScorer(FakeClock())).mkdir()
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
    """The curve is measured and decoded by; that it cannot be cached is said once, and each
    curve measured is announced as provisional for it (the next run measures it again)."""
    _unwritable(kind, tmp_path / "cache")
    if kind == "read-only-costs":
        _refuse_writes_as_root(tmp_path / "cache" / "costs", monkeypatch)
    scorer = FakeScorer(clock, seconds=lambda width: 0.1)  # both uses fit the process's budget
    curve = tuning_curve.curve_for(scorer, (1, 9))
    curve = tuning_curve.curve_for(scorer, range(1, 10), known=curve)  # the chain's widths
    assert set(curve.ms_by_width) == set(range(1, 10))
    assert sorted(scorer.forwards) == sorted([1, 9] * 4 + list(range(2, 9)) * 4)  # each width measured once
    lines = capsys.readouterr().err.strip().splitlines()
    cannot = [line for line in lines if "cannot cache" in line]
    assert len(cannot) == 1 and "cannot cache the cost curve" in cannot[0] and "decoding without" in cannot[0]
    measured = [line for line in lines if line not in cannot]
    assert len(measured) == 2 and all("the target's forward cost" in line and
                                      "provisional (the cache cannot be written)" in line for line in measured)
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
    costs = cache / tuning_curve.FOLDER
    costs.parent.mkdir(parents=True, exist_ok=True)
    if kind == "costs-file":
        costs.write_text("")
    else:  # every cost curve entry this run could write is a directory: make `costs` hold one for any key
        original = store.cache_path
        monkeypatch.setattr(store, "cache_path", lambda key, folder: costs / "entry.json"
                            if folder == tuning_curve.FOLDER else original(key, folder))
        (costs / "entry.json").mkdir(parents=True)
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
    key = tuning_curve.scorer_key(scorer)
    path = _entry_path(scorer)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema": cost.SCHEMA, "key": key,
                                "ms_by_width": {str(w): ms for w, ms in absurd.items()}}))
    curve = tuning_curve.curve_for(scorer, cost.SHAPE_WIDTHS)
    kept = {w for w, ms in absurd.items() if 1e-3 <= ms <= 6e4 and 0.1 <= ms / absurd[1] <= 1000}
    assert set(scorer.forwards) == set(cost.SHAPE_WIDTHS) - kept  # what is implausible is measured again
    assert all(store.MIN_PLAUSIBLE_MS <= ms <= 1000 for ms in curve.ms_by_width.values())
    assert _entry(scorer).curve.ms_by_width == curve.ms_by_width  # and the entry holds it now


def test_interpolation_and_shape_with_few_widths():
    """A partial curve (a bounded first use): tree_shape reads only measured tree widths; between
    measured widths a chain costs the next wider measured one."""
    partial = CostCurve({}, {1: 50.0, 9: 55.0, 17: 80.0})
    assert cost.tree_shape(partial) == cost.TreeShape(cost.TREE_TOPK, 8)
    assert partial.cost(4) == 55.0 and partial.cost(12) == 80.0


def test_bfloat16_without_native_instructions_claims_nothing_false(monkeypatch, capsys):
    """On this AVX2 CPU bfloat16 plain decoding ran 1.45x faster than float32: the old warning
    ("runs emulated (slower than float32)") was false here."""
    monkeypatch.setattr(models.device, "cpu_computes_bfloat16", lambda: False)
    assert models.resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "slower than float32" not in lines[0] and "emulated" not in lines[0]
    assert "may be slower or faster than float32" in lines[0] and "mars profile --dtypes" in lines[0]


def test_a_close_chain_or_tree_call_is_timed_again_once_and_cached(clock, monkeypatch, capsys):
    """An early head's figures on a noisy curve: chain 23.5 against tree 23.7 ms a token, within
    SHAPE_CLOSE. The deciding widths (1, the chain's 5, the tree's 9) are timed again together,
    SETTLE_REPEATS each, and their medians decide (here the tree), marked settled and cached."""
    from mars_cli.decoding.acceptance import EARLY_HEAD
    from mars_cli.decoding.tree import CHAIN, TreeShape

    scorer = FakeScorer(clock, seconds=lambda width: {1: 0.040, 5: 0.040, 9: 0.042}.get(width, 0.05))
    key = tuning_curve.scorer_key(scorer)
    noisy = CostCurve(key, {1: 36.2, 2: 36.7, 3: 47.5, 4: 46.0, 5: 46.0, 9: 50.7, 17: 63.3})
    verdict = cost.shape_verdict(noisy, EARLY_HEAD)
    assert verdict.shape == CHAIN and verdict.closeness < cost.SHAPE_CLOSE and verdict.deciding == (1, 5, 9)
    settled = tuning_curve.settle(scorer, noisy, verdict.deciding)
    assert sorted(set(scorer.forwards)) == [1, 5, 9]
    assert all(scorer.forwards.count(w) == 1 + tuning_curve.SETTLE_REPEATS for w in (1, 5, 9))  # a warm-up, then timed
    assert settled.ms_by_width[9] == pytest.approx(42.0) and settled.ms_by_width[17] == 63.3
    cached = _entry(scorer, (1, 5, 9))
    assert settled.settled == {1, 5, 9} and cached.curve.settled == {1, 5, 9} and cached.provenance.provisional is None
    assert cost.shape_verdict(settled, EARLY_HEAD).shape == TreeShape(cost.TREE_TOPK, 8)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "close call" in lines[0] and "timing widths 1, 5, 9 again (once" in lines[0]
    scorer.forwards.clear()
    again = tuning_curve.curve_for(scorer, (1, 5, 9, 17))  # the next session reads the settled widths back
    assert again.settled == {1, 5, 9} and again.ms_by_width[9] == pytest.approx(42.0) and scorer.forwards == []
    monkeypatch.setattr(tuning_clock, "BUDGET", tuning_clock.Budget(0.0))  # the process's budget spent
    assert tuning_curve.settle(scorer, noisy, (1, 5, 9)) is noisy and scorer.forwards == []


def test_a_settling_cut_short_is_provisional(clock, monkeypatch):
    """Settling cut short by the process's budget: the widths it timed replace the old ones, none
    is marked settled, and the entry is saved provisional (a later run settles them)."""
    monkeypatch.setattr(tuning_clock, "BUDGET", tuning_clock.Budget(4.0))
    scorer = FakeScorer(clock, seconds=lambda width: 1.0)
    key = tuning_curve.scorer_key(scorer)
    noisy = CostCurve(key, {1: 900.0, 5: 950.0, 9: 990.0})
    partial = tuning_curve.settle(scorer, noisy, (1, 5, 9))
    # the prefill, width 1 warmed up and timed (2.5 s), width 5 warmed up (3.5 s): its timing, 1 s
    # by that warm-up, would end past the 4 s, so width 5 keeps its old figure and 9 is not reached
    assert scorer.forwards == [1, 1, 5] and clock.now == pytest.approx(3.5)
    assert partial.settled == frozenset() and partial.ms_by_width == {1: 1000.0, 5: 950.0, 9: 990.0}
    cached = _entry(scorer, (1, 5, 9))
    assert cached.curve.settled == frozenset() and cached.curve.ms_by_width == partial.ms_by_width
    assert cached.provenance.provisional == "the settling ran out of its budget"


def test_a_stand_in_that_a_later_run_times_only_in_part_is_never_settled(clock, monkeypatch):
    """A stand-in curve (nothing timed) measured again with too little budget keeps the figures it
    did not time as stand-ins: the entry stays unreusable, and a run with budget enough times
    every width again before the curve is settled (its stand-in figures never settle as measured)."""
    from mars_cli.tuning import choice

    monkeypatch.setattr(tuning_clock, "BUDGET", tuning_clock.Budget(0.0))  # the first: nothing at all
    first = tuning_curve.measured_curve(FakeScorer(clock), (1, 9, 17))
    assert first.provenance.stale and first.provenance.provisional
    monkeypatch.setattr(tuning_clock, "BUDGET", tuning_clock.Budget(3.0))  # the next: width 1 and a little
    partly = FakeScorer(clock)
    second = tuning_curve.measured_curve(partly, (1, 9, 17))
    assert partly.forwards and second.provenance.stale and second.provenance.provisional
    plain = second.curve.ms_by_width[1]  # timed now: the stand-in's wanted widths scaled to it, the rest dropped
    assert set(second.curve.ms_by_width) == {1, 9, 17} and 17 not in partly.forwards
    assert second.curve.ms_by_width[17] == pytest.approx(tuning_curve.default_curve({}, plain).ms_by_width[17])
    entry = choice.read(tuning_curve.CurveMeasurement(partly, (1, 9, 17)))
    assert entry.provenance.stale and not entry.provenance.reusable
    monkeypatch.setattr(tuning_clock, "BUDGET", tuning_clock.Budget())
    full = FakeScorer(clock, seconds=lambda width: 0.1)
    third = tuning_curve.measured_curve(full, (1, 9, 17))
    assert {1, 9, 17} <= set(full.forwards) and third.provenance.provisional is None
    assert set(third.curve.ms_by_width) == {1, 9, 17}  # the stand-in's other widths are gone
