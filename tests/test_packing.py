"""`--packed-weights` (mars_cli/packing.py): packed linears give the numbers dense ones do, never run
on a stale or swapped weight, leave autograd alone; `auto` packs only where the (mocked) timing
says it pays, caches that by its key and measures a corrupt entry again; bad values are one line."""

from __future__ import annotations

import json
import os

import pytest
import torch

from mars_cli import packing
from mars_cli.decoding import cost
from mars_cli.errors import UserError
from mars_cli.models import load_model
from mars_cli.options import DecodingOptions
from mars_cli.session import Session
from tests.test_cli import run_cli
from tests.test_dtype_choice import cache  # noqa: F401 - the test's own cache, a quiet machine, notes afresh

pytestmark = pytest.mark.skipif(packing.problem(torch.nn.Linear(8, 8).to(torch.bfloat16)) is not None,
                                reason="this torch or CPU has no oneDNN packed bfloat16 product")


@pytest.fixture(autouse=True)
def dense_auto_packing():
    """Overrides conftest's fixture of this name: here `--packed-weights auto` measures."""
    yield


@pytest.fixture
def bf16_target(tiny_dir):
    return load_model(str(tiny_dir), device="cpu", dtype="bfloat16")


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
    """time_interleaved mocked: fixed block times per variant, each variant still run once."""
    runs: list[str] = []

    def timed(run, items, repeats, synchronize=lambda: None, deadline=None):
        for item in items:
            run(item)
            runs.append(item)
        return {"dense": [dense_ms] * repeats, "packed": [packed_ms] * repeats}

    monkeypatch.setattr(cost, "time_interleaved", timed)
    return runs


def test_auto_packs_where_the_measurement_says_it_pays_and_caches_it(bf16_target, monkeypatch, cache, capsys):
    runs = fake_timing(monkeypatch, dense_ms=100.0, packed_ms=80.0)
    choice = packing.settle(bf16_target, "auto", compiled=False)
    assert choice.packed and not choice.cached and packing.installed(bf16_target.model)
    assert runs == ["dense", "packed"]
    assert "linears packed" in capsys.readouterr().err
    entry = json.loads(next((cache / packing.FOLDER).glob("*.json")).read_text())
    assert entry["packed"] is True and entry["key"]["dtype"] == "bfloat16"
    again = packing.settle(bf16_target, "auto", compiled=False)
    assert again.cached and again.packed and runs == ["dense", "packed"]  # read, not measured


def test_auto_stays_dense_within_noise(bf16_target, monkeypatch):
    fake_timing(monkeypatch, dense_ms=100.0, packed_ms=99.0)
    choice = packing.settle(bf16_target, "auto", compiled=False)
    assert not choice.packed and not packing.installed(bf16_target.model)


def test_a_close_call_is_timed_again_and_decided_on_every_block(bf16_target, monkeypatch, cache, capsys):
    timings = iter([{"dense": [100.0] * 5, "packed": [99.0] * 5},  # 0.99: a close call at 0.97
                    {"dense": [100.0] * 5, "packed": [80.0] * 5}])
    runs = []

    def timed(run, items, repeats, synchronize=lambda: None, deadline=None):
        runs.append(list(items))
        return next(timings)

    monkeypatch.setattr(cost, "time_interleaved", timed)
    choice = packing.settle(bf16_target, "auto", compiled=False)
    assert len(runs) == 2 and choice.timed_twice and choice.packed  # median of 99 x 5 and 80 x 5: 89.5
    assert choice.ms_packed == 89.5 and choice.unsaved is None
    assert "timed twice: a close call" in capsys.readouterr().err
    assert packing.settle(bf16_target, "auto", compiled=False).timed_twice  # and so it is cached


def test_a_clear_verdict_is_timed_once(bf16_target, monkeypatch):
    runs = fake_timing(monkeypatch, dense_ms=100.0, packed_ms=70.0)
    assert packing.settle(bf16_target, "auto", compiled=False).packed and runs == ["dense", "packed"]


@pytest.mark.parametrize("entry", ["{not json", '{"schema": 1}', "contradicts"])
def test_a_corrupt_or_contradictory_entry_is_measured_again(bf16_target, monkeypatch, cache, entry):
    runs = fake_timing(monkeypatch, dense_ms=100.0, packed_ms=80.0)
    path = cost.cache_path(packing.packing_key(bf16_target), packing.FOLDER)
    path.parent.mkdir(parents=True, exist_ok=True)
    if entry == "contradicts":  # says packed, with times that say it does not pay
        entry = json.dumps({"schema": packing.SCHEMA, "packed": True, "ms_dense": 100.0, "ms_packed": 120.0,
                            "key": packing.packing_key(bf16_target)})
    path.write_text(entry)
    choice = packing.settle(bf16_target, "auto", compiled=False)
    assert not choice.cached and choice.packed and runs == ["dense", "packed"]


def test_a_busy_machine_measures_for_this_run_only(bf16_target, monkeypatch, cache, capsys):
    fake_timing(monkeypatch, dense_ms=100.0, packed_ms=80.0)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    choice = packing.settle(bf16_target, "auto", compiled=False)
    assert choice.packed and choice.unsaved and "busy" in choice.unsaved
    assert not (cache / packing.FOLDER).is_dir() or not list((cache / packing.FOLDER).glob("*.json"))
    assert "for this run only" in capsys.readouterr().err


def test_the_real_measurement_leaves_the_model_dense(bf16_target):
    choice = packing.measure(bf16_target, packing.packing_key(bf16_target))
    assert choice.ms_dense > 0 and choice.ms_packed > 0
    assert not packing.installed(bf16_target.model)


def test_float16_and_compiled_forwards_are_not_packed(tiny_dir, bf16_target):
    half = load_model(str(tiny_dir), device="cpu", dtype="float32")
    for parameter in half.model.parameters():
        parameter.data = parameter.data.to(torch.float16)
    assert packing.problem(half.model) == "only bfloat16 and float32 linear layers on the CPU are packed"
    assert not packing.settle(half, "auto", compiled=False).packed
    assert not packing.settle(bf16_target, "auto", compiled=True).packed
    with pytest.raises(UserError, match="^--packed-weights on: only bfloat16 and float32"):
        packing.settle(half, "on", compiled=False)
    assert not packing.installed(half.model)


def test_a_bad_value_is_one_line_exit_2(capsys, tiny_dir):
    code, out, err = run_cli(capsys, "generate", "abc", "--target", str(tiny_dir), "--device", "cpu",
                             "--packed-weights", "fast")
    assert code == 2 and out == ""
    assert err.strip() == "mars: error: --packed-weights fast: expected auto, on or off"


def test_a_close_call_follows_a_dtype_chosen_on_packed_timings(bf16_target, monkeypatch, capsys):
    """--dtype auto compared packed bfloat16 with float32: a dense/packed tie then runs packed, as
    bfloat16 was timed; dense clearly faster (at PREFERENCE of packed or less) still wins."""
    fake_timing(monkeypatch, dense_ms=100.0, packed_ms=99.0)
    assert not packing.settle(bf16_target, "auto", compiled=False).packed  # on its own: dense within noise
    choice = packing.settle(bf16_target, "auto", compiled=False, timed_packed=True)
    assert choice.packed and choice.follows_dtype and packing.installed(bf16_target.model)
    assert "as --dtype auto timed it" in capsys.readouterr().err
    assert not packing.settle(bf16_target, "off", compiled=False, timed_packed=True).packed


def test_dense_clearly_faster_stays_dense_whatever_the_dtype_was_timed_on(bf16_target, monkeypatch):
    fake_timing(monkeypatch, dense_ms=90.0, packed_ms=100.0)
    choice = packing.settle(bf16_target, "auto", compiled=False, timed_packed=True)
    assert not choice.packed and not choice.follows_dtype and not packing.installed(bf16_target.model)


def test_the_session_passes_on_how_its_dtype_was_timed():
    from types import SimpleNamespace

    from mars_cli.dtype_choice import Candidate, DtypeChoice
    from mars_cli.session import Session

    def session_with(dtype: torch.dtype, packed: bool) -> SimpleNamespace:
        choice = DtypeChoice({}, "bfloat16", [Candidate("float32", True, ms_per_step=40.0),
                                              Candidate("bfloat16", True, ms_per_step=38.0, packed=packed)])
        return SimpleNamespace(target=SimpleNamespace(dtype=dtype, dtype_choice=choice))

    assert Session._dtype_timed_packed(session_with(torch.bfloat16, packed=True))
    assert not Session._dtype_timed_packed(session_with(torch.bfloat16, packed=False))
    assert not Session._dtype_timed_packed(session_with(torch.float32, packed=True))  # --dtype float32 given
