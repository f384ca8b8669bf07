"""Every measurement of the machine cut short at every point still returns a valid choice
(issue 56, item 0: a busy machine once ran the int8 head's budget out before its int8 variant was
timed, and `mars generate` ended in a KeyError): before anything, before each variant's first
sample, between variants, during the dtype's usability check. The clock is fake: it reads 0 until its `cut`-th
reading, then far past every deadline, so each run is cut at a different point; `cut` grows until
a run finishes before the clock is ever cut, so every point is covered. No timing decides a test."""

from __future__ import annotations

import pytest
import torch

from mars_cli.head import int8 as int8_rows
from mars_cli.head.train import new_eagle3_head
from mars_cli.tuning import clock, int8
from mars_cli.models import load_model

MOST_READINGS = 400  # more clock readings than any of these measurements takes uncut
JUMP_S = 30.0  # past every deadline here (set from 0, at most 12 s), yet a plausible time for one sample


class CutClock:
    """A millisecond more at each reading; from its `cut`-th on, JUMP_S later (every deadline, set
    from 0, long past)."""

    def __init__(self, cut: int) -> None:
        self.cut, self.readings = cut, 0

    def __call__(self) -> float:
        self.readings += 1
        return self.readings * 1e-3 + (0.0 if self.readings <= self.cut else JUMP_S)

    @property
    def was_cut(self) -> bool:
        return self.readings > self.cut


def read_back(measurement, result):
    """`result` saved as its entry and read again, as the next run would (provisional when cut)."""
    from mars_cli.tuning import choice

    choice.save(measurement, result)
    return choice.read(measurement)


def every_cut(monkeypatch, measure) -> list:
    """`measure()` under a clock cut after 0, 1, 2, ... readings, until a run is never cut."""
    results = []
    for cut in range(MOST_READINGS):
        cut_clock = CutClock(cut)
        monkeypatch.setattr(clock, "now", cut_clock)
        results.append(measure())
        if not cut_clock.was_cut:
            return results
    raise AssertionError(f"the measurement read the clock more than {MOST_READINGS} times")


@pytest.mark.skipif(int8_rows.problem(torch.nn.Linear(32, 32).to(torch.bfloat16)) is not None,
                    reason="this torch or CPU has no weight-only int8 product")
def test_the_int8_head_measurement_cut_anywhere_keeps_a_valid_choice(bf16_target, monkeypatch, cache):
    torch.manual_seed(0)
    head = new_eagle3_head(bf16_target, torch.arange(40), {}).eval().to(torch.bfloat16).attach(bf16_target.model)
    monkeypatch.setattr(int8, "REPEATS", 2)
    key = int8.int8_key(head, bf16_target)
    results = every_cut(monkeypatch, lambda: int8.measure(head, bf16_target, key, int8.BUDGET_S))
    assert len(results) > 2
    for choice in results:  # int8 only where both were timed; a variant left untimed: provisional
        both = choice.ms_full is not None and choice.ms_int8 is not None
        assert choice.used == (both and choice.ms_int8 <= int8.PREFERENCE * choice.ms_full)
        assert both or choice.provenance.provisional is not None
    assert results[0].ms_full is None and not results[0].used  # cut before anything: the head's own weights
    measurement = int8.Int8Measurement(head, bf16_target)
    for choice in results:  # every partial entry reads back as itself: the next run does not measure again
        again = read_back(measurement, choice)
        assert again is not None and (again.used, again.ms_full, again.ms_int8) == (choice.used, choice.ms_full, choice.ms_int8)
    assert any(r.ms_full is not None and r.ms_int8 is None for r in results)  # cut before int8's first block
    assert results[-1].ms_int8 is not None and not int8_rows.installed(head)


def test_the_packing_measurement_cut_anywhere_keeps_a_valid_choice(bf16_target, monkeypatch, cache):
    from mars_cli.decoding.packing import installed, problem
    from mars_cli.tuning import packing

    if problem(bf16_target.model) is not None:
        pytest.skip(f"packing is not possible here: {problem(bf16_target.model)}")
    monkeypatch.setattr(packing, "REPEATS", 2)
    key = packing.packing_key(bf16_target)
    results = every_cut(monkeypatch, lambda: packing.measure(bf16_target, key, packing.BUDGET_S))
    assert len(results) > 2
    for choice in results:  # packed only where both were timed; a variant left untimed: provisional
        both = choice.ms_dense is not None and choice.ms_packed is not None
        assert choice.packed == (both and choice.ms_packed <= packing.PREFERENCE * choice.ms_dense)
        assert both or choice.provenance.provisional is not None
    assert results[0].ms_dense is None and not results[0].packed and not installed(bf16_target.model)
    measurement = packing.PackingMeasurement(bf16_target)
    for choice in results:  # every partial entry reads back as itself: the next run does not measure again
        again = read_back(measurement, choice)
        assert again is not None and (again.packed, again.ms_dense, again.ms_packed) == (choice.packed, choice.ms_dense,
                                                                                         choice.ms_packed)
    assert any(r.ms_dense is not None and r.ms_packed is None for r in results)  # cut before packed's first block


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
def test_the_dtype_measurement_cut_anywhere_keeps_a_valid_choice(tiny_dir, monkeypatch, cache, speculative):
    from mars_cli.tuning import dtype as dtype_choice

    target = load_model(str(tiny_dir), device="cpu", dtype="float32")
    monkeypatch.setattr(dtype_choice, "REPEATS", 2)
    key = dtype_choice.dtype_key(target.fingerprint, target.device, speculative)
    results = every_cut(monkeypatch, lambda: dtype_choice.measure(target, key, dtype_choice.BUDGET_S))
    assert len(results) > 2
    for choice in results:
        assert choice.chosen in key["candidates"] and target.model.lm_head.weight.dtype == torch.float32
        timed = {c.dtype for c in choice.candidates if c.ms_per_step is not None}
        assert choice.chosen in timed or choice.chosen == "float32"  # a dtype never timed is never chosen
        assert timed == set(key["candidates"]) or choice.provenance.provisional is not None
    measurement = dtype_choice.DtypeMeasurement(target, speculative)
    for choice in results:  # every partial entry reads back as itself: the next run does not measure again
        again = read_back(measurement, choice)
        assert again is not None and again.chosen == choice.chosen and again.candidates == choice.candidates
    unchecked = [r for r in results if any(c.problem == dtype_choice.UNCHECKED for c in r.candidates)]
    assert unchecked and all(r.chosen == "float32" for r in unchecked)  # cut during the usability check
