"""The llama.cpp engine's thread count as a measured choice (mars_cli/tuning/threads.py), on a fake
engine and a fake clock: fewer threads only when clearly faster, cached, provisional when cut short
or busy, all the cores when nothing was measured. No llama.cpp needed."""

from __future__ import annotations

import os

import pytest
import torch

from mars_cli.tuning import clock, machine, threads


class FakeEngine:
    class settings:
        @staticmethod
        def thread_count() -> int:
            return 2


class FakeTarget:
    fingerprint = "fake-gguf"
    device = torch.device("cpu")
    dtype = "gguf-q4_1"
    vocab_size = 100


class FakeScorer:
    """A plain step costs `ms[threads]` on the fake clock."""

    def __init__(self, clocks, ms: dict[int, float]) -> None:
        self.clocks, self.ms, self.threads = clocks, ms, 2
        self.engine, self.target = FakeEngine(), FakeTarget()
        self.steps = 0

    def engine_key(self) -> dict:
        return {"engine": "llama.cpp", "binding": "test", "threads": self.threads}

    def set_threads(self, count: int) -> None:
        self.threads = count

    def start(self, context) -> None:
        pass

    def score(self, pending, tree, width):
        self.clocks["now"] += self.ms[self.threads] / 1000
        self.steps += 1

    def keep(self, rows) -> None:
        pass

    def rewind(self, length: int) -> None:
        pass


@pytest.fixture
def clocks(monkeypatch, cache, quiet_machine, fresh_measuring_budget):
    fake = {"now": 0.0, "wall": 1_000_000.0}
    monkeypatch.setattr(clock, "now", lambda: fake["now"])
    monkeypatch.setattr(clock, "wall", lambda: fake["wall"])
    return fake


@pytest.mark.parametrize("ms, chosen", [({1: 20.0, 2: 10.0}, 2), ({1: 9.0, 2: 10.0}, 1), ({1: 9.9, 2: 10.0}, 2)])
def test_fewer_threads_only_when_clearly_faster_and_then_cached(clocks, ms, chosen):
    scorer = FakeScorer(clocks, ms)
    first = threads.choose(scorer)
    assert first.threads == chosen and not first.provenance.cached and first.provenance.provisional is None
    assert first.ms_by_threads == pytest.approx({n: threads.STEPS * ms[n] for n in (1, 2)})
    assert scorer.threads == 2  # left on all the cores: the session sets the chosen count
    steps = scorer.steps
    again = threads.choose(scorer)
    assert again.threads == chosen and again.provenance.cached and scorer.steps == steps  # nothing timed


def test_a_measurement_cut_short_runs_on_all_cores_provisionally(clocks, monkeypatch):
    monkeypatch.setattr(threads, "BUDGET_S", 0.01)
    monkeypatch.setattr(threads.ThreadsMeasurement, "budget_s", 0.01)
    choice = threads.choose(FakeScorer(clocks, {1: 9.0, 2: 100.0}))
    assert choice.threads == 2 and choice.provenance.provisional


def test_a_busy_machine_keeps_it_provisional(clocks, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(machine, "_busy_memo", None, raising=False)
    scorer = FakeScorer(clocks, {1: 20.0, 2: 10.0})
    choice = threads.choose(scorer)
    assert choice.threads == 2 and choice.provenance.busy
    steps = scorer.steps
    assert threads.choose(scorer).provenance.cached and scorer.steps == steps  # not measured again under load


def test_a_damaged_entry_is_measured_again(clocks):
    scorer = FakeScorer(clocks, {1: 20.0, 2: 10.0})
    measurement = threads.ThreadsMeasurement(scorer)
    threads.choose(scorer)
    data = measurement.path.read_text().replace('"threads": 2', '"threads": 7')
    measurement.path.write_text(data)
    steps = scorer.steps
    assert threads.choose(scorer).threads == 2 and scorer.steps > steps
