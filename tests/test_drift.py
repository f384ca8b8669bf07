"""A session whose own forwards no longer match the cached measurements it decodes by forgets them
(mars_cli/drift.py): the cost curve, the dtype choice, the packing choice; once a session, with one
note; never on ratios within DRIFT nor on forwards too short to say anything about the machine."""

from __future__ import annotations

import pytest

from mars_cli import drift
from mars_cli.options import DecodingOptions
from mars_cli.session import Session
from tests.test_dtype_choice import Probe, auto, cache, entries  # noqa: F401 - the test's own cache


@pytest.fixture(autouse=True)
def steady_machine():
    """Overrides conftest's fixture of this name: here drift is looked for."""
    yield


@pytest.fixture(autouse=True)
def exact_auto_dtype():
    """Overrides conftest's fixture: `--dtype auto` measures (with the probe mocked below)."""
    yield


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


def test_a_session_whose_forwards_left_the_cached_curve_forgets_it_once(tiny_dir, cache, capsys):
    session = ngram_session(tiny_dir)
    session.run("abc abc abc abc")
    [entry] = curve_entries(cache)
    curve = session.draft_length().curve
    # the cached curve said every forward costs 20x what this session's take: another machine's day
    curve.ms_by_width.update({width: 20 * ms + drift.MIN_MS for width, ms in curve.ms_by_width.items()})
    capsys.readouterr()
    for _ in range(3):
        session.run("abc abc abc abc")
    err = capsys.readouterr().err
    assert not entry.exists()
    assert err.count("cached measurements give") == 1 and "the cost curve forgotten" in err and "faster" in err


def test_a_busy_machine_forgets_nothing(tiny_dir, monkeypatch, cache):
    import os

    session = ngram_session(tiny_dir)
    session.run("abc abc abc abc")
    curve = session.draft_length().curve
    curve.ms_by_width.update({width: 20 * ms + drift.MIN_MS for width, ms in curve.ms_by_width.items()})
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))  # another job explains the gap
    for _ in range(3):
        session.run("abc abc abc abc")
    assert len(curve_entries(cache)) == 1


def test_a_session_that_matches_its_curve_forgets_nothing(tiny_dir, monkeypatch, cache, capsys):
    monkeypatch.setattr(drift, "MIN_MS", 0.0)  # the tiny model's forwards count, noisy as they are
    monkeypatch.setattr(drift, "DRIFT", 1e6)  # ... against a line they cannot cross
    session = ngram_session(tiny_dir)
    for _ in range(3):
        session.run("abc abc abc abc")
    assert len(curve_entries(cache)) == 1 and "cached measurements give" not in capsys.readouterr().err


def test_forwards_too_short_to_tell_never_forget(tiny_dir, cache):
    session = ngram_session(tiny_dir)
    curve = session.draft_length().curve
    # cached at just under MIN_MS (as a tiny model's are): overhead, not the machine, whatever the session times
    curve.ms_by_width.update({width: drift.MIN_MS * 0.99 for width in curve.ms_by_width})
    for _ in range(3):
        session.run("abc abc abc abc")
    assert len(curve_entries(cache)) == 1


def test_plain_decoding_under_auto_forgets_a_dtype_choice_it_no_longer_matches(tiny_dir, monkeypatch, cache, capsys):
    fake = Probe({"float32": [400.0], "bfloat16": [900.0]})  # a cached step of 400 ms; the tiny model takes ~1
    from mars_cli import dtype_choice

    monkeypatch.setattr(dtype_choice, "time_steps", fake)
    target = auto(tiny_dir)
    [entry] = entries(cache)
    session = Session(DecodingOptions.of(target=str(tiny_dir), device="cpu", dtype="auto", draft="none",
                                         max_new_tokens=20), target=target)
    capsys.readouterr()
    session.run("abc abc abc")  # 20 rounds: fewer than MIN_ROUNDS, nothing decided yet
    assert entry.exists()
    session.run("abc abc abc")
    assert not entry.exists() and "the dtype choice forgotten" in capsys.readouterr().err
    assert auto(tiny_dir).dtype_choice.cached is False  # the next run measures again
    assert len(fake.asked) == 2


@pytest.mark.parametrize("as_json", [False, True])
def test_generate_checks_once_its_text_is_out(tiny_dir, monkeypatch, cache, capsys, as_json):
    from tests.test_cli import run_cli

    monkeypatch.setattr(drift, "MIN_MS", 0.0)
    monkeypatch.setattr(drift, "MIN_ROUNDS", 1)
    monkeypatch.setattr(drift, "ratio", lambda observed, expected: 3.0)  # whatever the tiny model timed
    args = ["generate", "abc abc abc", "--target", str(tiny_dir), "--draft", "ngram", "-n", "12", "--device", "cpu",
            "--dtype", "float32"] + (["--json"] if as_json else [])
    code, out, err = run_cli(capsys, *args)
    assert code == 0 and out.strip()
    assert "ran 3.0x the time the cached measurements give (slower" in err and "the cost curve forgotten" in err
    assert curve_entries(cache) == []
