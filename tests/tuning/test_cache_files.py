"""Cache files (issue 67, item 8): locks never opened through a planted link, in a folder only the
user can write; a tuning entry that does not validate (huge integers, Infinity) is measured again,
never a crash; $MARS_TUNING_BUDGET_S that is no finite number is said and not obeyed; a cost curve
that falls as the width grows is measured again."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mars_cli import notes, paths
from mars_cli.decoding import cost
from mars_cli.errors import UserError
from mars_cli.tuning import clock as tuning_clock
from mars_cli.tuning import curve as tuning_curve
from mars_cli.tuning import store
from mars_cli.tuning.choice import obtain, read

from .test_cost_first_use import FakeClock, FakeScorer


SHIPPED_MIN_FALL_MS = tuning_curve.MIN_FALL_MS  # read at import, before any fixture patches it


@pytest.fixture(autouse=True)
def falls_rule(monkeypatch):
    """The falling-curve rule at its shipped threshold (tests/conftest.py lifts it for the rest)."""
    monkeypatch.setattr(tuning_curve, "MIN_FALL_MS", SHIPPED_MIN_FALL_MS)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def mars_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(notes, "_SHOWN", set())
    return tmp_path / "cache"


def output_lock(path: Path, cache: Path) -> Path:
    key = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:24]
    return cache / "locks" / f"output-{key}.lock"


def victim(tmp_path: Path) -> Path:
    target = tmp_path / "precious.txt"
    target.write_text("precious\n")
    return target


# ----------------------------------------------------------------------------- locks
def test_a_planted_link_as_the_output_lock_overwrites_nothing(mars_cache, tmp_path):
    """The lock's name is a hash of the output's path: predictable. A link planted there had the
    claim truncate its target and write `mars eval (pid N)` into it."""
    precious, out = victim(tmp_path), tmp_path / "run"
    lock = output_lock(out, mars_cache)
    lock.parent.mkdir(parents=True)
    lock.symlink_to(precious)
    with pytest.raises(UserError, match="is a symbolic link, not a lock mars made; remove it"):
        paths.claim_output(out, "eval")
    assert precious.read_text() == "precious\n"
    paths.release_outputs()


def test_a_planted_link_as_the_output_lock_on_a_real_process(mars_cache, tmp_path, tiny_dir):
    precious, out = victim(tmp_path), tmp_path / "run"
    lock = output_lock(out, mars_cache)
    lock.parent.mkdir(parents=True)
    lock.symlink_to(precious)
    suite = tmp_path / "s.jsonl"
    suite.write_text('{"prompt": "Hi."}\n')
    env = {**os.environ, "MARS_CACHE": str(mars_cache), "MARS_SERVER": "off", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "mars_cli.cli", "eval", "--suite", str(suite), "--methods", "vanilla",
                           "-n", "2", "--target", str(tiny_dir), "--device", "cpu", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "is a symbolic link, not a lock mars made" in done.stderr
    assert precious.read_text() == "precious\n"


def test_the_locks_folder_is_the_users_alone(mars_cache, tmp_path):
    out = tmp_path / "run"
    paths.claim_output(out, "eval")
    paths.release_outputs()
    folder = mars_cache / "locks"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o777)  # made by an older mars, or by hand: others could plant a link in it
    paths.claim_output(out, "eval")
    paths.release_outputs()
    assert stat.S_IMODE(folder.stat().st_mode) & 0o022 == 0
    lock = output_lock(out, mars_cache)
    assert lock.is_file() and not lock.is_symlink() and "mars eval (pid" in lock.read_text()


def test_a_locks_folder_that_is_a_link_is_refused(mars_cache, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    mars_cache.mkdir()
    (mars_cache / "locks").symlink_to(elsewhere)
    with pytest.raises(UserError, match="locks is a symbolic link"):
        paths.claim_output(tmp_path / "run", "eval")
    assert not list(elsewhere.iterdir())


def test_a_fifo_or_a_hard_link_as_a_lock_is_refused_without_blocking(mars_cache, tmp_path):
    out = tmp_path / "run"
    lock = output_lock(out, mars_cache)
    lock.parent.mkdir(parents=True)
    os.mkfifo(lock)
    with pytest.raises(UserError, match="is not a regular file, not a lock mars made"):
        paths.claim_output(out, "eval")
    lock.unlink()
    os.link(victim(tmp_path), lock)
    with pytest.raises(UserError, match="a file with other names"):
        paths.claim_output(out, "eval")
    assert (tmp_path / "precious.txt").read_text() == "precious\n"


def test_the_gguf_conversion_lock_creates_nothing_at_a_planted_links_target(mars_cache, tmp_path):
    from mars_cli.models.gguf_cache import _entry_lock

    entry = mars_cache / "models" / "gguf-0123"
    target = tmp_path / "created-by-the-lock"
    (mars_cache / "locks").mkdir(parents=True)
    (mars_cache / "locks" / f"{entry.name}.lock").symlink_to(target)
    with pytest.raises(UserError, match="is a symbolic link"):
        with _entry_lock(entry, wait=True):
            pass
    assert not target.exists()
    (mars_cache / "locks" / f"{entry.name}.lock").unlink()
    with _entry_lock(entry, wait=True) as lock:  # an ordinary lock still works
        assert lock.acquired


def test_a_tuning_entry_lock_creates_nothing_at_a_planted_links_target(mars_cache, tmp_path):
    entry = mars_cache / "costs" / "0123.json"
    entry.parent.mkdir(parents=True)
    target = tmp_path / "created-by-the-lock"
    entry.with_name(entry.name + ".lock").symlink_to(target)
    with store.EntryLock(entry, wait_s=0.0) as lock:
        assert lock.acquired  # nothing to share: measured without a lock
    assert not target.exists()


# ----------------------------------------------------------------------------- entries that do not validate
@pytest.fixture
def clock(monkeypatch, mars_cache) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(tuning_clock, "now", fake)
    return fake


def write_curve_entry(scorer: FakeScorer, text: str) -> Path:
    path = store.cache_path(tuning_curve.scorer_key(scorer), tuning_curve.FOLDER)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def curve_entry(scorer: FakeScorer, **fields) -> str:
    data = {"schema": cost.SCHEMA, "key": tuning_curve.scorer_key(scorer),
            "ms_by_width": {str(w): 50.0 + w for w in (1, 2, 3)}, "settled": [], "provisional": "cut short",
            "measured_at": 1_000_000.0, "busy": False, "attempts": 1, "stale": False}
    text = json.dumps({**data, **{k: "@" + k for k in fields}})
    for name, raw in fields.items():
        text = text.replace(f'"@{name}"', raw)
    return text


@pytest.mark.parametrize("fields", [
    {"measured_at": "1" + "0" * 400},
    {"attempts": "Infinity"},
    {"attempts": "1e999"},
    {"measured_at": "NaN"},
    {"ms_by_width": '{"1": ' + "9" * 400 + ', "2": 52.0}'},
    {"ms_by_width": '{"1": 51.0, "2": Infinity}'},
])
def test_a_tuning_entry_with_a_huge_number_is_measured_again_not_a_crash(clock, fields):
    """Each crashed every command with an OverflowError until the file was deleted by hand."""
    scorer = FakeScorer(clock, seconds=lambda width: 0.05 + 0.001 * width)
    path = write_curve_entry(scorer, curve_entry(scorer, **fields))
    assert read(tuning_curve.CurveMeasurement(scorer, [1, 2, 3])) is None
    curve = tuning_curve.curve_for(scorer, [1, 2, 3])
    assert set(scorer.forwards) == {1, 2, 3} and set(curve.ms_by_width) == {1, 2, 3}  # measured again
    assert json.loads(path.read_text())["attempts"] == 1  # and the entry is a valid one now


def test_a_tuning_entry_with_a_huge_number_on_a_real_process(tmp_path, tiny_dir):
    """`mars generate` after its own entries were damaged: a crash on every command before."""
    cache = tmp_path / "cache"
    env = {**os.environ, "MARS_CACHE": str(cache), "MARS_SERVER": "off", "PYTHONPATH": str(ROOT),
           "MARS_TUNING_BUDGET_S": "3"}
    command = [sys.executable, "-m", "mars_cli.cli", "generate", "Hello", "-n", "4", "--target", str(tiny_dir),
               "--device", "cpu", "--draft", "ngram", "--num-draft", "auto"]
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    entries = [p for p in cache.rglob("*.json") if "locks" not in p.parts and "models" not in p.parts
               and '"measured_at"' in p.read_text()]
    assert entries, sorted(cache.rglob("*"))
    for entry in entries:
        data = json.loads(entry.read_text())
        text = json.dumps({**data, "measured_at": "@", "attempts": "@@"})
        entry.write_text(text.replace('"@@"', "Infinity").replace('"@"', "1" + "0" * 400))
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr


@pytest.mark.parametrize("value, seconds, said", [
    ("1e309", tuning_clock.LOOPS_S, "a float reads it as infinite"),
    ("nan", tuning_clock.LOOPS_S, "is not a finite number of seconds >= 0"),
    ("-1", tuning_clock.LOOPS_S, "is not a finite number of seconds >= 0"),
    ("abc", tuning_clock.LOOPS_S, "is not a finite number of seconds >= 0"),
    ("1e300", tuning_clock.MAX_BUDGET_S, f"is more than {tuning_clock.MAX_BUDGET_S:g} s"),
    ("20", 20.0, None),
    ("inf", float("inf"), None),  # spelled out: no bound, as asked
])
def test_a_budget_that_is_no_finite_number_is_said_and_not_obeyed(monkeypatch, capsys, value, seconds, said):
    """1e309 read as infinite: an 8-token one-liner spent 79 s tuning."""
    monkeypatch.setattr(notes, "_SHOWN", set())
    monkeypatch.setenv(tuning_clock.BUDGET_VARIABLE, value)
    assert tuning_clock.process_budget().left == seconds
    err = capsys.readouterr().err
    assert (said is None and not err) or (said in err and len(err.strip().splitlines()) == 1), err


def test_the_budget_on_a_real_process():
    env = {**os.environ, "MARS_TUNING_BUDGET_S": "1e309", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", "from mars_cli.tuning import clock; print(clock.BUDGET.left)"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"{tuning_clock.LOOPS_S}", done.stderr
    assert "MARS_TUNING_BUDGET_S='1e309' is not a finite number" in done.stderr


# ----------------------------------------------------------------------------- a curve that falls
def test_a_cached_curve_that_falls_as_the_width_grows_is_measured_again(clock):
    """A curve whose widest forward cost less than its narrower ones chose a 4 x 64 tree that ran
    2.3x slower than it said."""
    scorer = FakeScorer(clock, seconds=lambda width: 0.05 + 0.001 * width)
    falling = {1: 50.0, 9: 60.0, 17: 64.0, 25: 66.0, 33: 70.0, 49: 30.0, 65: 25.0}
    write_curve_entry(scorer, json.dumps({"schema": cost.SCHEMA, "key": tuning_curve.scorer_key(scorer),
                                          "ms_by_width": {str(w): ms for w, ms in falling.items()}}))
    assert tuning_curve.plausible(falling) == {}
    assert read(tuning_curve.CurveMeasurement(scorer, cost.SHAPE_WIDTHS)) is None
    curve = tuning_curve.curve_for(scorer, cost.SHAPE_WIDTHS)
    assert set(scorer.forwards) == set(cost.SHAPE_WIDTHS)  # every width measured again
    assert tuning_curve.falls(curve.ms_by_width) is None
    assert cost.tree_shape(curve).topk == 1 or curve.cost(65) >= curve.cost(1)


def test_a_measured_curve_that_falls_is_decided_on_the_narrower_costs_and_provisional(clock):
    scorer = FakeScorer(clock, seconds=lambda width: 0.05 if width == 1 else 0.08 if width < 9 else 0.01)
    found = obtain(tuning_curve.CurveMeasurement(scorer, [1, 2, 3, 9, 17]))
    costs = found.curve.ms_by_width
    assert tuning_curve.falls(costs) is None and costs[9] == costs[17] == pytest.approx(costs[3])
    assert "the cost fell as the width grew (width 9" in found.provenance.provisional
    cached = read(tuning_curve.CurveMeasurement(scorer, [1, 2, 3, 9, 17]))
    assert cached is not None and cached.curve.ms_by_width == costs  # read back as it was saved


def test_a_slight_dip_is_kept():
    assert tuning_curve.falls({1: 50.0, 9: 60.0, 17: 58.0, 25: 70.0}) is None
    assert tuning_curve.plausible({1: 50.0, 9: 60.0, 17: 58.0}) == {1: 50.0, 9: 60.0, 17: 58.0}
