"""The measured-choice protocol (mars_cli/tuning/choice.py) on a toy measurement, with a fake
clock, a fake wall clock and a fake load average: what is read, what is measured, what is kept as
provisional and when it is measured again, the process's budget across choices, and the lock's
wait. Measurements are counted; no timing decides a test."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import pytest

from mars_cli import notes
from mars_cli.tuning import choice, clock, machine, store
from mars_cli.tuning.choice import MeasuredChoice, Provenance, obtain


class Clocks:
    """The measuring clock and the wall clock, moved by the test (and by the toy's samples)."""

    def __init__(self) -> None:
        self.now, self.wall = 0.0, 1_000_000.0


@dataclass
class Toy:
    value: int
    samples: int
    provenance: Provenance = field(default_factory=Provenance)

    def fields(self) -> dict:
        return {"value": self.value, "samples": self.samples}


class ToyMeasurement(MeasuredChoice[Toy]):
    """SAMPLES samples of `seconds` each on the fake clock, stopping at the deadline."""

    what, folder, schema, budget_s = "toy measurement", "toy", 1, 6.0
    SAMPLES = 4

    def __init__(self, clocks: Clocks, name: str = "toy", seconds: float = 1.0, value: int = 7) -> None:
        self.clocks, self.name, self.seconds, self.value = clocks, name, seconds, value
        self.measured = 0

    @property
    def key(self) -> dict:
        return {"toy": self.name}

    def measure(self, deadline: float | None, previous: Toy | None = None) -> Toy:
        self.measured += 1
        taken = 0
        while taken < self.SAMPLES and (deadline is None or self.clocks.now < deadline):
            self.clocks.now += self.seconds
            taken += 1
        return Toy(self.value, taken, Provenance(provisional=None if taken == self.SAMPLES else "cut short"))

    def parse(self, data: dict) -> Toy | None:
        value, samples = data["value"], data["samples"]
        return Toy(value, samples) if isinstance(value, int) and isinstance(samples, int) else None

    def fallback(self, why: str) -> Toy:
        return Toy(0, 0, Provenance(provisional=why))

    def describe(self, result: Toy) -> str:
        return choice.announced(f"toy: {result.value}", result.provenance, "toy")


@pytest.fixture
def clocks(monkeypatch, tmp_path) -> Clocks:
    fake = Clocks()
    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(clock, "now", lambda: fake.now)
    monkeypatch.setattr(clock, "wall", lambda: fake.wall)
    monkeypatch.setattr(clock, "BUDGET", clock.Budget())
    monkeypatch.setattr(notes, "_SHOWN", set())
    return fake


def load(monkeypatch, average: float) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (average, average, average))


BUSY = 99.0  # above any machine's cores + LOAD_HEADROOM
OTHERS_LOAD = machine.others_load  # the real sampler (conftest's quiet_machine replaces it in every test)


def entry(toy: ToyMeasurement) -> dict:
    return json.loads(toy.path.read_text())


def test_a_settled_entry_is_read_and_nothing_is_measured(clocks):
    toy = ToyMeasurement(clocks)
    first = obtain(toy)
    assert toy.measured == 1 and first.value == 7 and first.provenance.provisional is None
    again = obtain(ToyMeasurement(clocks))
    assert again.provenance.cached and again.value == 7 and entry(toy)["provisional"] is None


def test_a_busy_measurement_is_provisional_and_not_measured_again_within_the_retry_interval(clocks, monkeypatch):
    load(monkeypatch, BUSY)
    toy = ToyMeasurement(clocks)
    first = obtain(toy)
    assert first.value == 7 and "busy" in first.provenance.provisional and entry(toy)["busy"] is True
    for _ in range(5):  # five more calls, busy: the provisional entry decides, nothing is measured
        assert obtain(toy).provenance.cached
    clocks.wall += choice.RETRY_AFTER_S  # the interval passed, still busy: still nothing
    assert obtain(toy).provenance.cached and toy.measured == 1
    load(monkeypatch, 0.0)  # quiet, the interval passed: measured again, settled
    assert not obtain(toy).provenance.cached and toy.measured == 2 and entry(toy)["provisional"] is None


def test_a_quiet_machine_waits_out_the_interval_of_a_busy_entry(clocks, monkeypatch):
    load(monkeypatch, BUSY)
    toy = ToyMeasurement(clocks)
    obtain(toy)
    load(monkeypatch, 0.0)
    clocks.wall += choice.RETRY_AFTER_S - 1
    assert obtain(toy).provenance.cached and toy.measured == 1


def test_a_cut_short_quiet_measurement_goes_on_at_the_next_runs_then_waits(clocks, monkeypatch):
    toy = ToyMeasurement(clocks, seconds=4.0)  # two samples fit its 6 s
    results = []
    for _ in range(choice.QUIET_ATTEMPTS + 2):
        monkeypatch.setattr(clock, "BUDGET", clock.Budget())  # each call a process of its own
        results.append(obtain(toy))
    assert toy.measured == choice.QUIET_ATTEMPTS  # then it waits for the interval
    assert [r.provenance.attempts for r in results[:choice.QUIET_ATTEMPTS]] == list(range(1, choice.QUIET_ATTEMPTS + 1))
    assert all(r.provenance.provisional == "cut short" for r in results)
    clocks.wall += choice.RETRY_AFTER_S
    monkeypatch.setattr(clock, "BUDGET", clock.Budget())
    obtain(toy)
    assert toy.measured == choice.QUIET_ATTEMPTS + 1


def test_one_process_measures_at_most_its_budget_over_all_its_choices(clocks):
    toys = [ToyMeasurement(clocks, name=str(n), seconds=2.0) for n in range(4)]
    results = [obtain(toy) for toy in toys]
    assert clocks.now <= clock.PROCESS_BUDGET_S + toys[0].seconds  # a sample started in time may end past it
    spent = [r for r in results if r.provenance.provisional and "spent" in r.provenance.provisional]
    assert spent and all(r.value == 0 for r in spent)  # the fallback, for this run
    assert all(entry(toys[results.index(r)])["provisional"] for r in spent)  # kept: not re-measured by each call


def test_after_a_busy_first_call_every_later_call_measures_nothing(clocks, monkeypatch):
    """The busy-machine goal on the protocol: a first call measures what its budget allows and
    falls back for the rest; five later calls (each a process) measure nothing at all."""
    load(monkeypatch, BUSY)
    toys = [ToyMeasurement(clocks, name=str(n), seconds=3.0) for n in range(4)]
    for toy in toys:
        obtain(toy)
    first = [toy.measured for toy in toys]
    for _ in range(5):
        monkeypatch.setattr(clock, "BUDGET", clock.Budget())
        for toy in toys:
            assert obtain(toy).provenance.cached
    assert [toy.measured for toy in toys] == first


def test_a_drift_makes_an_entry_stale_and_the_next_quiet_run_measures_it(clocks):
    toy = ToyMeasurement(clocks)
    obtain(toy)
    assert choice.mark_provisional(toy.path, "the session's forwards ran 2.0x the time it gives")
    assert entry(toy)["stale"] is True and not choice.mark_provisional(toy.path, "again")  # once
    again = obtain(toy)
    assert toy.measured == 2 and again.provenance.provisional is None and entry(toy)["stale"] is False


def test_a_held_lock_is_waited_for_at_most_what_is_left_of_the_budget(clocks, monkeypatch):
    waits = []

    class Held(store.EntryLock):
        def __enter__(self):
            waits.append(self.wait_s)
            return self  # never acquired: another process holds it

    monkeypatch.setattr(store, "EntryLock", Held)
    monkeypatch.setattr(clock, "BUDGET", clock.Budget(2.5))
    toy = ToyMeasurement(clocks)
    result = obtain(toy)
    assert waits == [2.5] and toy.measured == 0 and result.value == 0 and not toy.path.exists()
    assert "another mars process" in result.provenance.provisional


@pytest.mark.parametrize("bad", ["{not json", '{"schema": 1}', "[]", '{"schema": 1, "key": {"toy": "toy"}, '
                                 '"value": "7", "samples": 4}', '{"schema": 1, "key": {"toy": "toy"}, "value": 7, '
                                 '"samples": 4, "provisional": 3}'])
def test_a_malformed_entry_is_measured_again(clocks, bad):
    toy = ToyMeasurement(clocks)
    toy.path.parent.mkdir(parents=True, exist_ok=True)
    toy.path.write_text(bad)
    assert obtain(toy).value == 7 and toy.measured == 1


def test_the_load_average_rule(monkeypatch):
    monkeypatch.setattr(machine, "others_load", lambda seconds=machine.SAMPLE_S: 0.0)
    load(monkeypatch, machine.usable_cores() + machine.LOAD_HEADROOM + 0.1)
    assert "busy machine" in machine.busy_reason()
    load(monkeypatch, machine.usable_cores())
    assert machine.busy_reason() is None


def test_other_processes_on_our_cores_make_the_machine_busy(monkeypatch):
    """The load average lags, and two spinning jobs hold it at 2.0 on 2 cores, under its rule: the
    CPU time other processes took over a short sample decides too (faked here: no timing)."""
    load(monkeypatch, 0.0)
    busy_ticks, own_ticks = iter([1000, 1000 + 70]), iter([500, 500 + 20])  # 70 ticks busy, 20 of them ours
    monkeypatch.setattr(machine, "_busy_ticks", lambda cpus: next(busy_ticks))
    monkeypatch.setattr(machine, "_own_ticks", lambda: next(own_ticks))
    monkeypatch.setattr(machine.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(machine.os, "sysconf", lambda name: 100)
    others = OTHERS_LOAD(0.5)  # 50 ticks of others over 0.5 s at 100 ticks a second
    assert others == pytest.approx(1.0)
    monkeypatch.setattr(machine, "others_load", lambda seconds=machine.SAMPLE_S: 1.0)
    assert "other processes use 1.0" in machine.busy_reason()
    monkeypatch.setattr(machine, "others_load", lambda seconds=machine.SAMPLE_S: 0.2)
    assert machine.busy_reason() is None


@pytest.mark.parametrize(("value", "seconds"), [(None, clock.LOOPS_S), ("0", 0.0), ("30", 30.0), ("inf", float("inf")),
                                                ("-1", clock.LOOPS_S), ("nan", clock.LOOPS_S), ("ten", clock.LOOPS_S)])
def test_the_process_budget_can_be_set_in_the_environment(monkeypatch, capsys, value, seconds):
    monkeypatch.setattr(notes, "_SHOWN", set())
    if value is None:
        monkeypatch.delenv(clock.BUDGET_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(clock.BUDGET_VARIABLE, value)
    assert clock.process_budget().left == seconds
    said = capsys.readouterr().err
    assert (clock.BUDGET_VARIABLE in said) == (seconds == clock.LOOPS_S and value is not None)


def test_a_zero_budget_measures_nothing_and_falls_back(clocks, monkeypatch):
    monkeypatch.setattr(clock, "BUDGET", clock.Budget(0.0))
    toy = ToyMeasurement(clocks)
    result = obtain(toy)
    assert toy.measured == 0 and result.value == 0 and "spent" in result.provenance.provisional


def test_a_re_measurement_cut_short_keeps_the_entry_it_re_measured(clocks, monkeypatch):
    """A measurement never makes an answer worse: an entry due again (drift made it provisional)
    whose re-measurement is cut short by the budget keeps its answer, re-dated and provisional; a
    complete re-measurement replaces it; `mars tune` (fresh) replaces it whatever it finds."""
    settled = ToyMeasurement(clocks, value=7)
    assert obtain(settled).value == 7 and entry(settled)["provisional"] is None
    assert choice.mark_provisional(settled.path, "drift: the forwards left the curve")
    for cut in range(1, ToyMeasurement.SAMPLES):  # cut after every sample it could take
        monkeypatch.setattr(clock, "BUDGET", clock.Budget())
        starved = ToyMeasurement(clocks, value=0, seconds=ToyMeasurement.budget_s / cut + 0.01)
        kept = obtain(starved)
        assert starved.measured == 1 and kept.value == 7 and kept.provenance.provisional is not None
        assert entry(starved)["value"] == 7 and entry(starved)["measured_at"] == clocks.wall
        clocks.wall += choice.RETRY_AFTER_S  # due again
    monkeypatch.setattr(clock, "BUDGET", clock.Budget())
    full = ToyMeasurement(clocks, value=9)
    assert obtain(full).value == 9 and entry(full)["provisional"] is None  # complete: replaces
    monkeypatch.setattr(clock, "BUDGET", clock.Budget())
    tuned = ToyMeasurement(clocks, value=3, seconds=4.0)  # cut short, but asked for by `mars tune`
    assert obtain(tuned, fresh=True).value == 3 and entry(tuned)["value"] == 3


def test_a_busy_re_measurement_keeps_the_entry_it_re_measured(clocks, monkeypatch):
    toy = ToyMeasurement(clocks, value=7)
    obtain(toy)
    choice.mark_provisional(toy.path, "drift")
    load(monkeypatch, BUSY)
    monkeypatch.setattr(machine, "busy_reason", lambda: "the machine is busy")
    again = ToyMeasurement(clocks, value=1)
    monkeypatch.setattr(choice, "due", lambda result: True)
    kept = obtain(again)
    assert again.measured == 1 and kept.value == 7 and entry(again)["busy"] is True
