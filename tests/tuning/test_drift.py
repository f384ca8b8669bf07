"""A session whose own forwards no longer match the cached measurements it decodes by makes them
provisional (mars_cli/tuning/drift.py, choice.mark_provisional): the cost curve, the dtype choice,
the packing choice; once a session, with one note; still used, and measured again by the next
quiet run; never on a busy machine, on ratios within DRIFT nor on forwards too short to say
anything about the machine."""

from __future__ import annotations

import json
import math

import pytest

from mars_cli.options import DecodingOptions
from mars_cli.session import Session
from mars_cli.tuning import clock, curve, drift
from mars_cli.tuning import dtype as tuning_dtype
from tests.tuning.test_dtype_choice import Probe, auto, cache, read_entry  # noqa: F401 - the test's own cache


@pytest.fixture(autouse=True)
def steady_machine():
    """Overrides conftest's fixture of this name: here drift is looked for."""
    yield


@pytest.fixture(autouse=True)
def exact_auto_dtype():
    """Overrides conftest's fixture: `--dtype auto` measures (with the probe mocked below)."""
    yield


@pytest.fixture(autouse=True)
def fresh_measuring_budget(monkeypatch):
    """Overrides conftest's fixture of this name: each test measures as a process of its own, and
    without a deadline, so that a cost curve is measured whole on a loaded test machine (one cut
    short is provisional already: no drift could make it so)."""
    next_process(monkeypatch)


def next_process(monkeypatch) -> None:
    """The next run: a process of its own, with its own (here endless) measuring budget."""
    monkeypatch.setattr(clock, "BUDGET", clock.Budget(math.inf))


def test_the_ratio_is_the_median_over_widths_of_what_was_comparable():
    expected = {1: 40.0, 17: 50.0, 25: 2.0}.get
    assert drift.ratio({1: 80.0, 17: 100.0, 25: 40.0, 33: 70.0}, expected) == 2.0  # 25: too short, 33: unknown
    assert drift.ratio({25: 40.0}, expected) is None
    assert drift.ratio({}, expected) is None


@pytest.mark.parametrize(("found", "expected"), [(None, False), (1.0, False), (1.45, False), (0.7, False),
                                                 (1.6, True), (0.6, True), (3.0, True)])
def test_drifted_either_way_beyond_the_line(found, expected):
    assert drift.drifted(found) is expected


def ngram_session(tiny_dir) -> Session:
    return Session(DecodingOptions.of(target=str(tiny_dir), device="cpu", dtype="float32", draft="ngram",
                                      num_draft="auto", max_new_tokens=48))


def curve_entries(cache) -> list:
    folder = cache / "costs"
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def settled_curve(cache) -> dict:
    """The one cached curve's entry, settled (not provisional)."""
    [entry] = curve_entries(cache)
    data = json.loads(entry.read_text())
    assert data["provisional"] is None
    return data


def drifted_curve(cache) -> dict:
    """The one cached curve's entry, made provisional by a drift: on a quiet machine, once."""
    [entry] = curve_entries(cache)
    data = json.loads(entry.read_text())
    assert "the session's forwards ran" in data["provisional"] and "x the time it gives" in data["provisional"]
    assert data["busy"] is False and data["attempts"] == 1
    return data


def timed_widths(monkeypatch) -> list:
    """The widths each cost curve measurement times from now on."""
    timed = []
    real = curve.time_width_samples

    def counting(scorer, widths, *args, **kwargs):
        timed.append(sorted(widths))
        return real(scorer, widths, *args, **kwargs)

    monkeypatch.setattr(curve, "time_width_samples", counting)
    return timed


def test_a_session_whose_forwards_left_the_cached_curve_makes_it_provisional_once(tiny_dir, monkeypatch, cache,
                                                                                  capsys):
    session = ngram_session(tiny_dir)
    session.run("abc abc abc abc")
    measured = settled_curve(cache)
    costs = session.draft_length().curve
    # the cached curve said every forward costs 20x what this session's take: another machine's day
    costs.ms_by_width.update({width: 20 * ms + drift.MIN_MS for width, ms in costs.ms_by_width.items()})
    capsys.readouterr()
    for _ in range(3):
        session.run("abc abc abc abc")
    err = capsys.readouterr().err
    assert drifted_curve(cache)["ms_by_width"] == measured["ms_by_width"]  # kept, to be used until measured again
    assert err.count("cached measurements give") == 1 and "the cost curve made provisional" in err and "faster" in err
    assert "measured again on the next quiet run" in err
    # the next run, on a quiet machine: measures the curve again, and settles it
    next_process(monkeypatch)
    timed = timed_widths(monkeypatch)
    ngram_session(tiny_dir).run("abc abc abc abc")
    assert timed and set(map(int, measured["ms_by_width"])) <= {width for widths in timed for width in widths}
    settled_curve(cache)


def test_a_busy_machine_marks_nothing(tiny_dir, monkeypatch, cache):
    import os

    session = ngram_session(tiny_dir)
    session.run("abc abc abc abc")
    costs = session.draft_length().curve
    costs.ms_by_width.update({width: 20 * ms + drift.MIN_MS for width, ms in costs.ms_by_width.items()})
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))  # another job explains the gap
    for _ in range(3):
        session.run("abc abc abc abc")
    settled_curve(cache)


def test_a_session_that_matches_its_curve_marks_nothing(tiny_dir, monkeypatch, cache, capsys):
    monkeypatch.setattr(drift, "MIN_MS", 0.0)  # the tiny model's forwards count, noisy as they are
    monkeypatch.setattr(drift, "DRIFT", 1e6)  # ... against a line they cannot cross
    session = ngram_session(tiny_dir)
    for _ in range(3):
        session.run("abc abc abc abc")
    settled_curve(cache)
    assert "cached measurements give" not in capsys.readouterr().err


def test_forwards_too_short_to_tell_never_mark(tiny_dir, cache):
    session = ngram_session(tiny_dir)
    costs = session.draft_length().curve
    # cached at just under MIN_MS (as a tiny model's are): overhead, not the machine, whatever the session times
    costs.ms_by_width.update({width: drift.MIN_MS * 0.99 for width in costs.ms_by_width})
    for _ in range(3):
        session.run("abc abc abc abc")
    settled_curve(cache)


def test_plain_decoding_under_auto_makes_a_dtype_choice_it_no_longer_matches_provisional(tiny_dir, monkeypatch,
                                                                                        cache, capsys):
    fake = Probe({"float32": [400.0], "bfloat16": [900.0]})  # a cached step of 400 ms; the tiny model takes ~1
    monkeypatch.setattr(tuning_dtype, "time_steps", fake)
    target = auto(tiny_dir)
    measured = read_entry(cache)
    assert measured["provisional"] is None
    session = Session(DecodingOptions.of(target=str(tiny_dir), device="cpu", dtype="auto", draft="none",
                                         max_new_tokens=20), target=target)
    capsys.readouterr()
    session.run("abc abc abc")  # 20 rounds: fewer than MIN_ROUNDS, nothing decided yet
    assert read_entry(cache) == measured
    session.run("abc abc abc")
    marked = read_entry(cache)
    assert "the session's forwards ran" in marked["provisional"] and marked["busy"] is False
    assert marked["chosen"] == measured["chosen"] and marked["candidates"] == measured["candidates"]
    assert "the dtype choice made provisional" in capsys.readouterr().err
    next_process(monkeypatch)  # the next run, on a quiet machine
    again = auto(tiny_dir).dtype_choice
    assert again.provenance.cached is False and again.provenance.provisional is None  # measured again, settled
    assert len(fake.asked) == 2 and read_entry(cache)["provisional"] is None


@pytest.mark.parametrize("as_json", [False, True])
def test_generate_checks_once_its_text_is_out(tiny_dir, monkeypatch, cache, capsys, as_json):
    from tests.cli.test_cli import run_cli

    monkeypatch.setattr(drift, "MIN_MS", 0.0)
    monkeypatch.setattr(drift, "MIN_ROUNDS", 1)
    monkeypatch.setattr(drift, "ratio", lambda observed, expected: 3.0)  # whatever the tiny model timed
    args = ["generate", "abc abc abc", "--target", str(tiny_dir), "--draft", "ngram", "-n", "12", "--device", "cpu",
            "--dtype", "float32"] + (["--json"] if as_json else [])
    code, out, err = run_cli(capsys, *args)
    assert code == 0 and out.strip()
    assert "ran 3.0x the time the cached measurements give (slower" in err and "the cost curve made provisional" in err
    assert "ran 3.0x the time it gives" in drifted_curve(cache)["provisional"]
