"""`--packed-weights`: packed linears (mars_cli/decoding/packing.py) give the numbers dense ones
do, never run on a stale or swapped weight, leave autograd alone; `auto` (mars_cli/tuning/packing.py)
packs only where the (mocked) timing says it pays, caches that by its key, measures a corrupt entry
again, and keeps a measurement taken on a busy machine as a provisional entry, measured again once
the machine is quiet and the retry interval has passed; bad values are one line."""

from __future__ import annotations

import json
import os

import pytest
import torch

from mars_cli.decoding import packing
from mars_cli.errors import UserError
from mars_cli.models import load_model
from mars_cli.options import DecodingOptions
from mars_cli.session import Session
from mars_cli.tuning import choice as measured, clock, machine, store
from mars_cli.tuning import packing as packing_choice
from tests.cli.test_cli import run_cli

pytestmark = pytest.mark.skipif(packing.problem(torch.nn.Linear(8, 8).to(torch.bfloat16)) is not None,
                                reason="this torch or CPU has no oneDNN packed bfloat16 product")


@pytest.fixture(autouse=True)
def dense_auto_packing():
    """Overrides conftest's fixture of this name: here `--packed-weights auto` measures."""
    yield


def linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [module for module in model.modules() if isinstance(module, torch.nn.Linear)]


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits.float()


# ----------------------------------------------------------------------------- same numbers
def test_packed_linears_give_the_dense_logits_at_every_width(bf16_target):
    ids = torch.randint(0, bf16_target.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    dense = [logits(bf16_target.model, ids[:, :width]) for width in (1, 5, 25, 40)]
    assert packing.install(bf16_target.model) == len(linears(bf16_target.model))
    assert packing.installed(bf16_target.model) and packing.install(bf16_target.model) == 0  # idempotent
    packed = [logits(bf16_target.model, ids[:, :width]) for width in (1, 5, 25, 40)]
    for expected, got in zip(dense, packed):
        assert torch.allclose(got, expected, rtol=0, atol=packing.TOLERANCE * float(expected.abs().max()))
        assert torch.equal(got.argmax(-1), expected.argmax(-1))
    packing.remove(bf16_target.model)
    assert not packing.installed(bf16_target.model)
    assert all("forward" not in layer.__dict__ for layer in linears(bf16_target.model))


def test_greedy_decoding_is_the_same_packed_or_dense(tiny_dir):
    results = {}
    for mode in ("on", "off"):
        session = Session(DecodingOptions.of(target=str(tiny_dir), device="cpu", dtype="bfloat16", draft="ngram",
                                             max_new_tokens=24, packed_weights=mode))
        assert session.packing.packed == (mode == "on") == packing.installed(session.target.model)
        assert session.config()["packed_weights"] == (mode == "on")
        results[mode] = session.run("abc abc abc").token_ids
    assert results["on"] == results["off"]


def test_a_swapped_or_cast_weight_is_never_read_stale(bf16_target):
    layer = linears(bf16_target.model)[0]
    packing.install(bf16_target.model)
    x = torch.randn(3, layer.in_features).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.data = torch.randn_like(layer.weight)  # what the dtype chooser's swaps do
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        layer.weight.mul_(0.5)  # an in-place write (an optimizer step)
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        layer.weight.data = layer.weight.data.float()  # a cast to float32
        assert torch.equal(layer(x.float()), torch.nn.functional.linear(x.float(), layer.weight, layer.bias))


def test_autograd_takes_the_dense_product(bf16_target):
    layer = linears(bf16_target.model)[0]
    packing.install(bf16_target.model)
    x = torch.randn(2, layer.in_features).to(torch.bfloat16).requires_grad_()
    layer(x).float().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- choosing
def fake_timing(monkeypatch, dense_ms: float, packed_ms: float) -> list[str]:
    """clock.time_interleaved mocked: fixed block times per variant, each variant still run once."""
    runs: list[str] = []

    def timed(run, items, repeats, synchronize=lambda: None, deadline=None, prepare=lambda item: None):
        for item in items:
            run(item)
            runs.append(item)
        return {"dense": [dense_ms] * repeats, "packed": [packed_ms] * repeats}

    monkeypatch.setattr(clock, "time_interleaved", timed)
    return runs


def test_auto_packs_where_the_measurement_says_it_pays_and_caches_it(bf16_target, monkeypatch, cache, capsys):
    runs = fake_timing(monkeypatch, dense_ms=100.0, packed_ms=80.0)
    choice = packing_choice.settle(bf16_target, "auto", compiled=False)
    assert choice.packed and not choice.provenance.cached and packing.installed(bf16_target.model)
    assert choice.provenance.provisional is None  # a quiet machine, measured in full: settled
    assert runs == ["dense", "packed"]
    assert "linears packed" in capsys.readouterr().err
    entry = json.loads(next((cache / packing_choice.FOLDER).glob("*.json")).read_text())
    assert entry["schema"] == packing_choice.SCHEMA and entry["provisional"] is None
    assert entry["packed"] is True and entry["key"]["dtype"] == "bfloat16"
    again = packing_choice.settle(bf16_target, "auto", compiled=False)
    assert again.provenance.cached and again.packed and runs == ["dense", "packed"]  # read, not measured


def test_auto_stays_dense_within_noise(bf16_target, monkeypatch, cache):
    fake_timing(monkeypatch, dense_ms=100.0, packed_ms=99.0)
    choice = packing_choice.settle(bf16_target, "auto", compiled=False)
    assert not choice.packed and not packing.installed(bf16_target.model)


def test_a_close_call_is_timed_again_and_decided_on_every_block(bf16_target, monkeypatch, cache, capsys):
    timings = iter([{"dense": [100.0] * 5, "packed": [99.0] * 5},  # 0.99: a close call at 0.97
                    {"dense": [100.0] * 5, "packed": [80.0] * 5}])
    runs = []

    def timed(run, items, repeats, synchronize=lambda: None, deadline=None, prepare=lambda item: None):
        runs.append(list(items))
        return next(timings)

    monkeypatch.setattr(clock, "time_interleaved", timed)
    choice = packing_choice.settle(bf16_target, "auto", compiled=False)
    assert len(runs) == 2 and choice.timed_twice and choice.packed  # median of 99 x 5 and 80 x 5: 89.5
    assert choice.ms_packed == 89.5 and choice.provenance.provisional is None
    assert "timed twice: a close call" in capsys.readouterr().err
    assert packing_choice.settle(bf16_target, "auto", compiled=False).timed_twice  # and so it is cached


def test_a_clear_verdict_is_timed_once(bf16_target, monkeypatch, cache):
    runs = fake_timing(monkeypatch, dense_ms=100.0, packed_ms=70.0)
    assert packing_choice.settle(bf16_target, "auto", compiled=False).packed and runs == ["dense", "packed"]


@pytest.mark.parametrize("entry", ["{not json", '{"schema": 1}', "contradicts"])
def test_a_corrupt_or_contradictory_entry_is_measured_again(bf16_target, monkeypatch, cache, entry):
    runs = fake_timing(monkeypatch, dense_ms=100.0, packed_ms=80.0)
    path = store.cache_path(packing_choice.packing_key(bf16_target), packing_choice.FOLDER)
    path.parent.mkdir(parents=True, exist_ok=True)
    if entry == "contradicts":  # says packed, with times that say it does not pay
        entry = json.dumps({"schema": packing_choice.SCHEMA, "packed": True, "ms_dense": 100.0, "ms_packed": 120.0,
                            "key": packing_choice.packing_key(bf16_target)})
    path.write_text(entry)
    choice = packing_choice.settle(bf16_target, "auto", compiled=False)
    assert not choice.provenance.cached and choice.packed and runs == ["dense", "packed"]


def test_a_busy_machine_measures_a_provisional_entry(bf16_target, monkeypatch, cache, capsys):
    """Measured on a busy machine: the verdict decides this run and is saved provisional; later
    runs use it without measuring until the retry interval has passed on a quiet machine, when it
    is measured again and settled."""
    runs = fake_timing(monkeypatch, dense_ms=100.0, packed_ms=80.0)
    load = machine.usable_cores() + 8.0  # every core shared, on any machine
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    choice = packing_choice.settle(bf16_target, "auto", compiled=False)
    assert choice.packed and packing.installed(bf16_target.model) and not choice.provenance.cached
    assert choice.provenance.busy and "busy" in choice.provenance.provisional
    entry = json.loads(next((cache / packing_choice.FOLDER).glob("*.json")).read_text())
    assert entry["packed"] is True and entry["busy"] is True and "busy" in entry["provisional"]
    assert "provisional" in capsys.readouterr().err
    assert runs == ["dense", "packed"]
    again = packing_choice.settle(bf16_target, "auto", compiled=False)  # still busy: used, not measured
    assert again.packed and again.provenance.cached and again.provenance.provisional and runs == ["dense", "packed"]
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    quiet = packing_choice.settle(bf16_target, "auto", compiled=False)  # quiet, but too soon
    assert quiet.provenance.cached and quiet.provenance.provisional and runs == ["dense", "packed"]
    measured_at = clock.wall()
    monkeypatch.setattr(clock, "wall", lambda: measured_at + measured.RETRY_AFTER_S + 1)
    settled = packing_choice.settle(bf16_target, "auto", compiled=False)  # quiet and due: measured again
    assert settled.packed and not settled.provenance.cached and settled.provenance.provisional is None
    assert not settled.provenance.busy and runs == ["dense", "packed"] * 2
    entry = json.loads(next((cache / packing_choice.FOLDER).glob("*.json")).read_text())
    assert entry["provisional"] is None and entry["busy"] is False


def test_the_real_measurement_leaves_the_model_dense(bf16_target):
    choice = packing_choice.measure(bf16_target, packing_choice.packing_key(bf16_target))
    assert choice.ms_dense > 0 and choice.ms_packed > 0
    assert choice.provenance.provisional is None  # no deadline: every block timed
    assert not packing.installed(bf16_target.model)


def test_float16_and_compiled_forwards_are_not_packed(tiny_dir, bf16_target):
    half = load_model(str(tiny_dir), device="cpu", dtype="float32")
    for parameter in half.model.parameters():
        parameter.data = parameter.data.to(torch.float16)
    assert packing.problem(half.model) == "only bfloat16 and float32 linear layers on the CPU are packed"
    assert not packing_choice.settle(half, "auto", compiled=False).packed
    assert not packing_choice.settle(bf16_target, "auto", compiled=True).packed
    with pytest.raises(UserError, match="^--packed-weights on: only bfloat16 and float32"):
        packing_choice.settle(half, "on", compiled=False)
    assert not packing.installed(half.model)


def test_a_bad_value_is_one_line_exit_2(capsys, tiny_dir):
    code, out, err = run_cli(capsys, "generate", "abc", "--target", str(tiny_dir), "--device", "cpu",
                             "--packed-weights", "fast")
    assert code == 2 and out == ""
    assert err.strip() == "mars: error: --packed-weights fast: expected auto, on or off"


def test_a_close_call_follows_a_dtype_chosen_on_packed_timings(bf16_target, monkeypatch, cache, capsys):
    """--dtype auto compared packed bfloat16 with float32: a dense/packed tie then runs packed, as
    bfloat16 was timed; dense clearly faster (at PREFERENCE of packed or less) still wins."""
    fake_timing(monkeypatch, dense_ms=100.0, packed_ms=99.0)
    assert not packing_choice.settle(bf16_target, "auto", compiled=False).packed  # on its own: dense within noise
    choice = packing_choice.settle(bf16_target, "auto", compiled=False, timed_packed=True)
    assert choice.packed and choice.follows_dtype and packing.installed(bf16_target.model)
    assert "as --dtype auto timed it" in capsys.readouterr().err
    assert not packing_choice.settle(bf16_target, "off", compiled=False, timed_packed=True).packed


def test_dense_clearly_faster_stays_dense_whatever_the_dtype_was_timed_on(bf16_target, monkeypatch, cache):
    fake_timing(monkeypatch, dense_ms=90.0, packed_ms=100.0)
    choice = packing_choice.settle(bf16_target, "auto", compiled=False, timed_packed=True)
    assert not choice.packed and not choice.follows_dtype and not packing.installed(bf16_target.model)


def test_the_session_passes_on_how_its_dtype_was_timed():
    """The session settles packing through plan.settle_packing, which passes on `timed_packed`."""
    from types import SimpleNamespace

    from mars_cli.tuning import plan
    from mars_cli.tuning.dtype import Candidate, DtypeChoice

    def target_with(dtype: torch.dtype, packed: bool) -> SimpleNamespace:
        choice = DtypeChoice({}, "bfloat16", [Candidate("float32", True, ms_per_step=40.0),
                                              Candidate("bfloat16", True, ms_per_step=38.0, packed=packed)])
        return SimpleNamespace(dtype=dtype, dtype_choice=choice)

    assert plan.timed_packed(target_with(torch.bfloat16, packed=True))
    assert not plan.timed_packed(target_with(torch.bfloat16, packed=False))
    assert not plan.timed_packed(target_with(torch.float32, packed=True))  # --dtype float32 given
