"""`mars tune` measures every choice afresh and caches it, after which a one-liner measures
nothing; `--stats` and `--json` say where start-up went and what each choice decided. The measured
choices run for real here (conftest's stand-ins are lifted), on the tiny model, in a cache of the
test's own."""

from __future__ import annotations

import json

import pytest

from mars_cli.tuning import clock
from tests.cli.test_cli import run_cli

PHASES = {"import", "load", "tuning", "prefill", "decoding"}


@pytest.fixture(autouse=True)
def exact_auto_dtype():
    """Overrides conftest's: `--dtype auto` measures here."""


@pytest.fixture(autouse=True)
def dense_auto_packing():
    """Overrides conftest's: `--packed-weights auto` measures here."""


@pytest.fixture(autouse=True)
def steady_steps(monkeypatch):
    """A tiny model's steps take about a millisecond, whose spread says nothing about the machine:
    the unsteady-steps rule (tested in tests/tuning/test_dtype_choice.py) would make these tests' entries
    provisional at random."""
    from mars_cli.tuning import dtype

    monkeypatch.setattr(dtype, "MAX_SPREAD", float("inf"))


@pytest.fixture(autouse=True)
def no_close_calls(monkeypatch):
    """Whether the chain-or-tree call is close on a tiny model's timings is chance; settling close
    calls (tune's and a session's alike) is tested in tests/tuning/test_cost_first_use.py."""
    from mars_cli.decoding import cost

    monkeypatch.setattr(cost, "SHAPE_CLOSE", -1.0)


def test_tune_measures_every_choice_and_later_runs_measure_nothing(capsys, tiny_dir, cache, monkeypatch):
    code, out, err = run_cli(capsys, "tune", "--target", str(tiny_dir), "--device", "cpu", "--json")
    assert code == 0, err
    report = json.loads(out)
    rows = {row["what"]: row for row in report["choices"]}
    packed = next(name for name in rows if name.startswith("packed linears ("))
    assert set(rows) == {"dtype (drafting sessions)", "dtype (plain sessions)", packed, "cost curve (x width 1)",
                         "int8 head"} and report["machine"]["threads"] >= 1
    for row in report["choices"]:
        assert row["provisional"] is None and row["seconds"] >= 0  # a quiet machine: settled
        assert row["entry"] is None or (cache / row["entry"].split("/cache/")[-1]).is_file()
    assert rows["int8 head"]["detail"] == "no draft head for this target"
    measured: list = []
    real = clock.time_interleaved
    monkeypatch.setattr(clock, "time_interleaved", lambda *args, **kwargs: measured.append(args[1]) or real(*args, **kwargs))
    code, out, _ = run_cli(capsys, "generate", "abc abc", "--target", str(tiny_dir), "--device", "cpu", "--json",
                           "--draft", "ngram", "-n", "8")
    assert code == 0 and measured == []  # every choice read from the cache
    payload = json.loads(out)
    assert payload["tuning"]["dtype"]["cached"] and payload["tuning"]["dtype"]["provisional"] is None
    packed_weights = payload["tuning"]["packed_weights"]
    # packing is either read from the cache or does not apply to this session's dtype (AVX2's bfloat16)
    assert packed_weights["cached"] != (packed_weights["problem"] is not None)
    assert payload["config"]["dtype"] == payload["tuning"]["dtype"]["value"]


def test_tune_table_names_the_machine_and_each_choice(capsys, tiny_dir, cache):
    code, out, _ = run_cli(capsys, "tune", "--target", str(tiny_dir), "--device", "cpu")
    assert code == 0
    assert "tuned for" in out and "threads" in out and "cost curve" in out and "dtype (plain sessions)" in out


def test_stats_and_json_show_where_start_up_went(capsys, tiny_dir, cache):
    code, out, err = run_cli(capsys, "generate", "abc abc", "--target", str(tiny_dir), "--device", "cpu", "--json",
                             "--draft", "ngram", "-n", "8", "--dtype", "float32")
    assert code == 0
    startup = json.loads(out)["stats"]["startup_s"]
    assert set(startup) == PHASES and all(v is None or v >= 0 for v in startup.values())
    assert json.loads(out)["tuning"]["dtype"] is None  # an explicit dtype: nothing decided
    code, _, err = run_cli(capsys, "generate", "abc abc", "--target", str(tiny_dir), "--device", "cpu", "--stats",
                           "--draft", "ngram", "-n", "8")
    assert code == 0 and "start-up" in err and "tuning" in err and "prefill" in err


def test_tune_settles_close_chain_or_tree_calls_until_the_call_stands(tiny_dir, cache, monkeypatch):
    """A settled close call can turn the verdict to another close one: tune settles again, as
    the next sessions would, until the call is not close or rests on settled widths."""
    from mars_cli.decoding import cost
    from mars_cli.decoding.cost import CostCurve
    from mars_cli.models import load_model
    from mars_cli.tuning import curve, tune

    monkeypatch.setattr(cost, "SHAPE_CLOSE", 0.15)
    target = load_model(str(tiny_dir), device="cpu", dtype="float32")
    steps = dict(tune.steps(target))
    for name in ("dtype for drafting sessions", "dtype for plain sessions", "packed linears"):
        steps[name]()
    flat = CostCurve({}, {w: 10.0 + 0.05 * w for w in cost.DEFAULT_WIDTHS})  # chains and trees near each other
    monkeypatch.setattr(curve, "curve_for", lambda *args, **kwargs: flat)
    settled: list[tuple[int, ...]] = []

    def settle(scorer, measured, widths, budget=None, announce=True):
        settled.append(tuple(widths))
        return CostCurve(measured.key, measured.ms_by_width, measured.settled | frozenset(widths))

    monkeypatch.setattr(curve, "settle", settle)
    steps["cost curve"]()
    verdict = cost.shape_verdict(CostCurve({}, flat.ms_by_width, frozenset(w for ws in settled for w in ws)))
    assert settled and len(settled) <= 2 * tune.SETTLINGS
    assert verdict.closeness > cost.SHAPE_CLOSE or set(verdict.deciding) <= {w for ws in settled for w in ws}
