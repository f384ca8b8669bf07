"""`--dtype auto` by measurement (mars_cli/tuning/dtype.py, settled by tuning/plan.py from
ModelOptions.load): the fastest usable dtype wins, an unusable one never does, the choice is cached
by its key, a corrupt entry is measured again, a busy machine's, unsteady or cut-short measurement
is saved provisional (tuning/choice.py) and measured again once it is due, explicit dtypes are
never measured, `mars profile --dtypes`."""

from __future__ import annotations

import json
import os

import pytest
import torch

from mars_cli import notes
from mars_cli.decoding import cost
from mars_cli.errors import UserError
from mars_cli.models import load_model
from mars_cli.options import ModelOptions
from mars_cli.tuning import weights as tuning_weights
from mars_cli.tuning import choice as protocol
from mars_cli.tuning import clock, curve, machine, store
from mars_cli.tuning import dtype as tuning_dtype
from mars_cli.tuning.choice import QUIET_ATTEMPTS, RETRY_AFTER_S
from tests.tuning.conftest import said


@pytest.fixture(autouse=True)
def exact_auto_dtype():
    """Overrides conftest's fixture of this name: here `--dtype auto` measures."""
    yield


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A cache of the test's own (never the developer's), a quiet machine, notes said afresh."""
    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(notes, "_SHOWN", set())
    return tmp_path / "cache"


class Probe:
    """The timing probe, mocked: fixed milliseconds per step for each dtype (the blocks given,
    repeated in turn up to the REPEATS blocks a full measurement has, or `blocks` of them: a
    measurement the budget cut short), calls counted. A speculative session's estimate is mocked
    too: `per_token` where given, else half a step, on a full curve unless named in `partial`."""

    def __init__(self, ms: dict[str, list[float]], per_token: dict[str, float] | None = None) -> None:
        self.ms, self.asked, self.per_token, self.estimated = ms, [], per_token or {}, []
        self.blocks = tuning_dtype.REPEATS
        self.partial: set[str] = set()  # dtypes whose estimate stands on a curve cut short

    def estimate(self, target, name, plain_ms, fresh=False):
        self.estimated.append(name)
        return (self.per_token.get(name, self.ms[name][0] / 2), "a chain of 2", name not in self.partial,
                {"1": 1.0, "2": 1.25})

    def __call__(self, target, use, names, deadline=None):
        self.asked.append(list(names))
        return {name: [self.ms[name][i % len(self.ms[name])] for i in range(self.blocks)] for name in names}


@pytest.fixture
def probe(monkeypatch):
    def install(per_token: dict[str, float] | None = None, **ms: list[float]) -> Probe:
        fake = Probe(ms, per_token)
        monkeypatch.setattr(tuning_dtype, "time_steps", fake)
        monkeypatch.setattr(tuning_dtype, "speculative_cost", fake.estimate)
        return fake
    return install


class Wall:
    """clock.wall, driven by the test: the dates entries are written with, and their age."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def wall(monkeypatch) -> Wall:
    fake = Wall()
    monkeypatch.setattr(clock, "wall", fake)
    return fake


def load_average(monkeypatch, load: float) -> None:
    """The load average os.getloadavg reports from now on (machine.busy_reason reads it)."""
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))


def busy_load() -> float:
    """A load average that makes this machine busy (machine.busy_reason)."""
    return machine.usable_cores() + 1.0


def auto(path) -> object:
    """The target loaded as a session loads it under `--dtype auto` (and `--packed-weights auto`),
    in a process of its own as far as measuring goes: a fresh budget (the real check's time must
    not spend the next call's on a loaded machine). conftest's fixture restores the budget after."""
    from mars_cli.tuning import clock

    clock.BUDGET = clock.Budget()
    return ModelOptions(target=str(path), device="cpu", dtype="auto").load()


def entries(cache) -> list:
    return sorted((cache / "dtypes").glob("*.json")) if (cache / "dtypes").is_dir() else []


def read_entry(cache) -> dict:
    [entry] = entries(cache)
    return json.loads(entry.read_text())


# ----------------------------------------------------------------------------- the fastest usable wins
def test_the_fastest_dtype_wins_and_is_converted_in_place(tiny_dir, probe, capsys, cache):
    from transformers import AutoModelForCausalLM

    fake = probe(float32=[10.0, 10.2, 9.9], bfloat16=[6.0, 6.1, 5.9])
    loaded = auto(tiny_dir)
    assert loaded.dtype == torch.bfloat16 and loaded.dtype_choice.chosen == "bfloat16"
    assert fake.asked == [["float32", "bfloat16"]]
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in loaded.model.buffers()} == {torch.float32}  # RoPE's frequencies stay float32
    lines = said(capsys).splitlines()  # the choice's own line: recorded for a session's one note
    assert len(lines) == 1 and "--dtype auto: bfloat16" in lines[0] and "6.0 ms in bfloat16" in lines[0]
    assert "cached" in lines[0] and "float32 is the exact mode" in lines[0]
    [entry] = entries(cache)
    assert json.loads(entry.read_text())["chosen"] == "bfloat16"
    # converted in place = loaded in bfloat16
    direct = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.bfloat16).eval()
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, direct(ids).logits)


def test_float32_wins_when_faster_or_within_noise(tiny_dir, probe, cache, capsys):
    probe(float32=[5.0, 5.0, 5.0], bfloat16=[8.0, 8.0, 8.0])
    assert auto(tiny_dir).dtype == torch.float32
    (cache / "dtypes").rename(cache / "elsewhere")
    probe(float32=[10.0, 10.0, 10.0], bfloat16=[9.8, 9.8, 9.8])  # 2% faster: not worth exactness
    said(capsys)
    assert auto(tiny_dir).dtype == torch.float32
    assert "float32 kept, exact: bfloat16 was not 3% faster" in said(capsys)


def test_a_close_call_is_timed_again_and_decided_on_every_block(tiny_dir, monkeypatch, cache, capsys):
    calls = iter([{"float32": [100.0] * 5, "bfloat16": [96.0] * 5},  # 0.96: a close call at 0.97
                  {"float32": [100.0] * 5, "bfloat16": [80.0] * 5}])
    asked = []

    def timing(target, use, names, deadline=None):
        asked.append(list(names))
        return next(calls)

    monkeypatch.setattr(tuning_dtype, "time_steps", timing)
    loaded = auto(tiny_dir)
    assert len(asked) == 2 and loaded.dtype_choice.chosen == "bfloat16"  # median of 96 x 5 and 80 x 5: 0.88
    bf16 = next(c for c in loaded.dtype_choice.candidates if c.dtype == "bfloat16")
    assert bf16.repeats == 10 and bf16.ms_per_step == 88.0
    assert "timed twice: a close call" in said(capsys)


def test_the_budget_covers_the_check_and_a_dtype_it_left_unchecked_is_measured_again(tiny_dir, monkeypatch, cache):
    """The check's work is fixed (whole prompts through each dtype); on a CPU converting bfloat16 in
    software it once took most of the budget. The measurement's deadline counts from its start,
    check included (a one-liner never waits on tuning for long): a dtype whose check the deadline
    cut is not used, and the measurement is provisional, measured again by the next quiet run."""
    now = {"now": 1000.0}
    monkeypatch.setattr(clock, "now", lambda: now["now"])
    real_check = tuning_dtype.check_usable
    checks = []

    def slow_check(target, use, names, deadline=None):
        if not checks:
            now["now"] += 60.0  # the first run's check: longer than the whole budget
        checks.append(names)
        return real_check(target, use, names, deadline)

    deadlines = []

    def time_steps(target, use, names, deadline=None):
        deadlines.append(deadline)
        return {name: [10.0 if name == "float32" else 6.0] * tuning_dtype.REPEATS for name in names}

    monkeypatch.setattr(tuning_dtype, "check_usable", slow_check)
    monkeypatch.setattr(tuning_dtype, "time_steps", time_steps)
    target = load_model(str(tiny_dir), device="cpu", dtype="float32")
    choice = tuning_dtype.choose(target)
    assert deadlines == [1000.0 + tuning_dtype.BUDGET_S]  # from the measurement's start
    [bf16] = [c for c in choice.candidates if c.dtype == "bfloat16"]
    assert choice.chosen == "float32" and not bf16.usable and bf16.problem == tuning_dtype.UNCHECKED
    assert "before timing bfloat16 fully" in choice.provenance.provisional and not choice.provenance.busy
    assert read_entry(cache)["provisional"] == choice.provenance.provisional
    # this process's measuring budget is spent: it measures nothing more
    assert tuning_dtype.choose(target).provenance.cached and len(deadlines) == 1
    monkeypatch.setattr(clock, "BUDGET", clock.Budget())  # the next run: a process of its own, on a quiet machine
    again = tuning_dtype.choose(target)
    assert deadlines == [1000.0 + tuning_dtype.BUDGET_S, 1060.0 + tuning_dtype.BUDGET_S]
    assert again.chosen == "bfloat16" and again.provenance.provisional is None  # complete: settled
    assert read_entry(cache)["provisional"] is None


def test_the_real_probe_interleaves_dtypes_and_leaves_float32_weights(tiny_target):
    used: list[str] = []
    with tuning_weights.Weights(tiny_target.model) as weights:
        def use(name: str) -> None:
            used.append(name)
            weights.use(name)

        ms = tuning_dtype.time_steps(tiny_target, use, ["float32", "bfloat16"])
    # each warmed up just before its first timed block, then A B A B ...
    repeats = tuning_dtype.REPEATS
    assert used == ["float32", "float32", "bfloat16", "bfloat16"] + ["float32", "bfloat16"] * (repeats - 1)
    assert {name: len(values) for name, values in ms.items()} == {"float32": repeats, "bfloat16": repeats}
    assert all(0 < value < 60_000 for values in ms.values() for value in values)
    assert {p.dtype for p in tiny_target.model.parameters()} == {torch.float32}


# ----------------------------------------------------------------------------- usability
def test_a_dtype_with_nan_logits_is_skipped_even_if_fastest(tiny_dir, probe, monkeypatch, capsys):
    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[1.0, 1.0, 1.0])
    real_check = tuning_dtype.check_usable

    def nan_in_bfloat16(target, use, names, deadline=None):
        poison = lambda module, args, out: out * float("nan") if out.dtype == torch.bfloat16 else None  # noqa: E731
        handle = target.model.lm_head.register_forward_hook(poison)
        try:
            return real_check(target, use, names, deadline)
        finally:
            handle.remove()

    monkeypatch.setattr(tuning_dtype, "check_usable", nan_in_bfloat16)
    loaded = auto(tiny_dir)
    assert loaded.dtype == torch.float32
    assert fake.asked == [["float32"]]  # an unusable dtype is not even timed
    [bf16] = [c for c in loaded.dtype_choice.candidates if c.dtype == "bfloat16"]
    assert not bf16.usable and "not finite" in bf16.problem
    line = said(capsys)
    assert "bfloat16 not usable here: its logits are not finite" in line


def test_a_dtype_that_disagrees_with_float32_is_skipped(tiny_dir, probe, monkeypatch):
    probe(float32=[10.0, 10.0, 10.0], bfloat16=[1.0, 1.0, 1.0])
    real = tuning_dtype._argmaxes

    def shifted(target, use, name, prompts, deadline=None):
        chosen, finite = real(target, use, name, prompts, deadline)
        return ([row + 1 for row in chosen] if name == "bfloat16" else chosen), finite

    monkeypatch.setattr(tuning_dtype, "_argmaxes", shifted)
    loaded = auto(tiny_dir)
    assert loaded.dtype == torch.float32
    [bf16] = [c for c in loaded.dtype_choice.candidates if c.dtype == "bfloat16"]
    assert bf16.agreement == 0.0 and "agree with float32's at 0%" in bf16.problem


def test_the_check_passes_a_working_bfloat16(tiny_target):
    with tuning_weights.Weights(tiny_target.model) as weights:
        found = tuning_dtype.check_usable(tiny_target, weights.use, ["float32", "bfloat16"])
    assert [c.usable for c in found] == [True, True]
    assert found[1].agreement >= tuning_dtype.MIN_AGREEMENT


def test_the_check_reads_whole_prompts_in_order_until_it_has_enough_positions(tiny_target, monkeypatch):
    """Three short prompts were once the whole check: 43 positions, too few to tell 88% from 95%."""
    prompts = tuning_dtype.check_prompts(tiny_target)
    lengths = [row.numel() for row in prompts]
    assert sum(lengths) >= tuning_dtype.CHECK_POSITIONS  # the calibration prompts hold enough
    assert sum(lengths[:-1]) < tuning_dtype.CHECK_POSITIONS  # and no prompt past the one that reached it
    assert max(lengths) <= tuning_dtype.CHECK_TOKENS
    texts = [json.loads(line)["prompt"] for line in tuning_dtype.CALIBRATION_PROMPTS.read_text().splitlines()]
    assert prompts[0].tolist() == list(tiny_target.tokenizer(texts[0])["input_ids"])[: tuning_dtype.CHECK_TOKENS]
    monkeypatch.setattr(tuning_dtype, "CHECK_POSITIONS", 10**9)  # more than there are: every prompt, once
    assert len(tuning_dtype.check_prompts(tiny_target)) == len(texts)


# ----------------------------------------------------------------------------- the cache
def test_the_cache_is_keyed(tiny_dir, tiny_draft_dir, probe, monkeypatch):
    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[6.0, 6.0, 6.0])
    assert auto(tiny_dir).dtype == torch.bfloat16
    again = auto(tiny_dir)
    assert again.dtype == torch.bfloat16 and again.dtype_choice.provenance.cached and len(fake.asked) == 1
    auto(tiny_draft_dir)  # another model
    assert len(fake.asked) == 2
    monkeypatch.setattr(machine, "cpu_name", lambda: "another CPU")  # another machine
    auto(tiny_dir)
    assert len(fake.asked) == 3
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # the same machine, oneDNN kept to AVX2
    auto(tiny_dir)
    assert len(fake.asked) == 4
    auto(tiny_dir)
    assert len(fake.asked) == 4  # cached under that cap
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")  # ATEN_CPU_CAPABILITY=default
    auto(tiny_dir)
    assert len(fake.asked) == 5


def _valid_entry(cache) -> tuple[object, dict]:
    [entry] = entries(cache)
    return entry, json.loads(entry.read_text())


CORRUPTIONS = {
    "not json": lambda data: "{not json",
    "unknown dtype": lambda data: {**data, "chosen": "float8"},
    "unknown candidate": lambda data: {**data, "candidates": [{**c, "dtype": "int4"} for c in data["candidates"]]},
    "missing field": lambda data: {**data, "candidates": [{k: v for k, v in c.items() if k != "ms_per_step"}
                                                          for c in data["candidates"]]},
    "no chosen": lambda data: {k: v for k, v in data.items() if k != "chosen"},
    "implausible time": lambda data: {**data, "candidates": [{**c, "ms_per_step": 1e-9} for c in data["candidates"]]},
    "not the fastest": lambda data: {**data, "chosen": "float32"},
    "old schema": lambda data: {**data, "schema": 0},
    "a list": lambda data: [data],
    "a reason that is no text": lambda data: {**data, "provisional": 5},
    "a date that is no number": lambda data: {**data, "provisional": "busy", "measured_at": "yesterday"},
    "busy that is no flag": lambda data: {**data, "provisional": "busy", "busy": "yes"},
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_corrupt_or_stale_entry_is_measured_again(tiny_dir, probe, cache, wall, kind):
    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[6.0, 6.0, 6.0])
    auto(tiny_dir)
    entry, data = _valid_entry(cache)
    broken = CORRUPTIONS[kind](data)
    entry.write_text(broken if isinstance(broken, str) else json.dumps(broken))
    assert auto(tiny_dir).dtype == torch.bfloat16
    assert len(fake.asked) == 2
    assert _valid_entry(cache)[1] == data  # rewritten whole


def test_an_entry_that_is_a_directory_is_measured_and_noted(tiny_dir, probe, cache, capsys):
    probe(float32=[10.0, 10.0, 10.0], bfloat16=[6.0, 6.0, 6.0])
    key = tuning_dtype.dtype_key(load_model(str(tiny_dir), device="cpu", dtype="float32").fingerprint,
                                 torch.device("cpu"), packed=True)  # --packed-weights auto times packed
    store.cache_path(key, tuning_dtype.FOLDER).mkdir(parents=True)
    loaded = auto(tiny_dir)
    assert loaded.dtype == torch.bfloat16
    assert loaded.dtype_choice.provenance.provisional == "the cache cannot be written"
    err = capsys.readouterr().err
    assert "cannot cache the dtype measurement" in err and "the next run measures it again" in err


# ----------------------------------------------------------------------------- a busy machine
def test_a_busy_machines_measurement_is_provisional_until_due_on_a_quiet_machine(tiny_dir, probe, monkeypatch,
                                                                                 cache, capsys, wall):
    """Measuring again on every run under load once took a one-liner 11-16 s: a busy machine's
    measurement decides its run and is saved provisional, used as it is until RETRY_AFTER_S have
    passed and the machine is quiet, then measured again."""
    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[6.0, 6.0, 6.0])
    cores = machine.usable_cores()
    load_average(monkeypatch, busy_load())
    loaded = auto(tiny_dir)
    assert loaded.dtype == torch.bfloat16  # used for this run
    why = f"load average {busy_load():.1f} on {cores} cores"
    provenance = loaded.dtype_choice.provenance
    assert why in provenance.provisional and provenance.busy and not provenance.cached
    data = read_entry(cache)
    assert data["chosen"] == "bfloat16" and why in data["provisional"] and data["busy"] is True
    assert data["measured_at"] == wall.now and data["attempts"] == 1
    line = said(capsys)
    assert why in line and "provisional" in line and f"{RETRY_AFTER_S / 60:.0f} min have passed" in line
    # within the interval: used as it is, busy or quiet, nothing measured
    again = auto(tiny_dir)
    assert again.dtype == torch.bfloat16 and again.dtype_choice.provenance.cached and len(fake.asked) == 1
    assert why in again.dtype_choice.provenance.provisional
    load_average(monkeypatch, 0.0)
    wall.advance(RETRY_AFTER_S - 1)
    assert auto(tiny_dir).dtype_choice.provenance.cached and len(fake.asked) == 1
    # the interval has passed, but the machine is busy still: used as it is
    wall.advance(1)
    load_average(monkeypatch, busy_load())
    assert auto(tiny_dir).dtype_choice.provenance.cached and len(fake.asked) == 1
    # ... and quiet: measured again, and settled
    load_average(monkeypatch, 0.0)
    settled = auto(tiny_dir)
    assert len(fake.asked) == 2 and settled.dtype == torch.bfloat16
    assert not settled.dtype_choice.provenance.cached and settled.dtype_choice.provenance.provisional is None
    assert read_entry(cache)["provisional"] is None
    assert auto(tiny_dir).dtype_choice.provenance.cached and len(fake.asked) == 2  # a warm run measures nothing


def test_unsteady_steps_are_provisional_and_measured_again_on_the_next_quiet_runs(tiny_dir, probe, cache, wall):
    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[6.0, 14.0, 6.0])
    loaded = auto(tiny_dir)
    provenance = loaded.dtype_choice.provenance
    assert provenance.provisional and "varied more than 2x" in provenance.provisional and not provenance.busy
    data = read_entry(cache)
    assert "varied more than 2x" in data["provisional"] and data["busy"] is False and data["attempts"] == 1
    # a quiet machine measures it again on its next runs, up to QUIET_ATTEMPTS in a row
    for attempt in range(2, QUIET_ATTEMPTS + 1):
        assert auto(tiny_dir).dtype_choice.provenance.cached is False
        assert len(fake.asked) == attempt and read_entry(cache)["attempts"] == attempt
    again = auto(tiny_dir)
    assert again.dtype_choice.provenance.cached and len(fake.asked) == QUIET_ATTEMPTS  # then not before ...
    wall.advance(RETRY_AFTER_S)  # ... RETRY_AFTER_S have passed
    fake.ms["bfloat16"] = [6.0, 6.1, 5.9]  # steady now
    settled = auto(tiny_dir)
    assert len(fake.asked) == QUIET_ATTEMPTS + 1 and settled.dtype_choice.provenance.provisional is None
    assert read_entry(cache)["provisional"] is None


def test_a_measurement_cut_short_on_a_quiet_machine_is_measured_again_on_the_next_run(tiny_dir, probe, cache):
    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[6.0, 6.0, 6.0])
    fake.blocks = 2  # the budget ran out after two blocks of each
    loaded = auto(tiny_dir)
    assert loaded.dtype == torch.bfloat16  # decides this run
    provenance = loaded.dtype_choice.provenance
    assert "ran out of its budget before timing float32 and bfloat16 fully" in provenance.provisional
    assert not provenance.busy and read_entry(cache)["provisional"] == provenance.provisional
    fake.blocks = tuning_dtype.REPEATS
    again = auto(tiny_dir)
    assert len(fake.asked) == 2 and not again.dtype_choice.provenance.cached
    assert again.dtype_choice.provenance.provisional is None and read_entry(cache)["provisional"] is None


def test_a_held_lock_decodes_in_float32_uncached(tiny_dir, probe, monkeypatch, cache):
    import fcntl

    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[6.0, 6.0, 6.0])
    key = tuning_dtype.dtype_key(load_model(str(tiny_dir), device="cpu", dtype="float32").fingerprint,
                                 torch.device("cpu"), packed=True)  # --packed-weights auto times packed
    lock = store.cache_path(key, tuning_dtype.FOLDER).with_suffix(".json.lock")
    lock.parent.mkdir(parents=True)
    monkeypatch.setattr(protocol, "LOCK_WAIT_S", 0.0)
    with open(lock, "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        loaded = auto(tiny_dir)
    assert loaded.dtype == torch.float32 and "still measuring" in loaded.dtype_choice.provenance.provisional
    assert fake.asked == [] and entries(cache) == []


# ----------------------------------------------------------------------------- explicit dtypes
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
def test_an_explicit_dtype_never_measures(tiny_dir, monkeypatch, cache, name):
    def refuse(*args, **kwargs):
        raise AssertionError("an explicit dtype was measured")

    monkeypatch.setattr(tuning_dtype, "time_steps", refuse)
    monkeypatch.setattr(tuning_dtype, "check_usable", refuse)
    loaded = ModelOptions(target=str(tiny_dir), device="cpu", dtype=name).load()
    assert loaded.dtype == getattr(torch, name) and loaded.dtype_choice is None
    assert entries(cache) == []


def test_explicit_float16_on_cpu_is_checked(tiny_dir, monkeypatch, capsys):
    from mars_cli.cli import main

    monkeypatch.setattr(tuning_dtype, "time_steps", Probe({}))  # never asked
    real = tuning_dtype._argmaxes

    def broken_half(target, use, name, prompts, deadline=None):
        chosen, finite = real(target, use, name, prompts, deadline)
        return chosen, finite and name != "float16"

    monkeypatch.setattr(tuning_dtype, "_argmaxes", broken_half)
    code = main(["generate", "abc", "--target", str(tiny_dir), "--device", "cpu", "--dtype", "float16", "-n", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("mars: error: --dtype float16 is unusable on this CPU: its logits are not finite")

    def cannot(target, use, name, prompts, deadline=None):
        if name == "float16":
            raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'\nmore")
        return real(target, use, name, prompts, deadline)

    monkeypatch.setattr(tuning_dtype, "_argmaxes", cannot)
    with pytest.raises(UserError, match="torch cannot run it .*not implemented for 'Half'\\)"):
        ModelOptions(target=str(tiny_dir), device="cpu", dtype="float16").load()


def test_explicit_float16_that_passes_the_check_loads(tiny_dir, monkeypatch):
    real = tuning_dtype._argmaxes
    monkeypatch.setattr(tuning_dtype, "_argmaxes", lambda target, use, name, prompts, deadline=None: real(
        target, use, "float32", prompts, deadline))  # as float32's
    loaded = ModelOptions(target=str(tiny_dir), device="cpu", dtype="float16").load()
    assert loaded.dtype == torch.float16 and {p.dtype for p in loaded.model.parameters()} == {torch.float16}


def test_a_draft_model_takes_its_targets_measured_dtype(tiny_dir, tiny_draft_dir, probe):
    from mars_cli.options import DecodingOptions
    from mars_cli.session import Session

    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[6.0, 6.0, 6.0])
    session = Session(DecodingOptions.of(target=str(tiny_dir), draft=str(tiny_draft_dir), device="cpu",
                                         num_draft="2", max_new_tokens=4))
    assert session.target.dtype == session.draft_model.dtype == torch.bfloat16
    assert len(fake.asked) == 1  # the draft model is not measured


# ----------------------------------------------------------------------------- speculative sessions
def test_a_drafting_session_chooses_by_cost_per_token_a_plain_one_by_step(tiny_dir, probe, cache, capsys):
    """bfloat16's plain step is slower, but its wide forwards make a token cheaper: a session that
    drafts decodes in bfloat16, one that does not in float32; two entries, each measured once."""
    from mars_cli.options import DecodingOptions
    from mars_cli.session import Session

    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[11.0, 11.0, 11.0], per_token={"float32": 8.0, "bfloat16": 5.0})
    drafting = Session(DecodingOptions.of(target=str(tiny_dir), draft="ngram", device="cpu", max_new_tokens=4))
    plain = Session(DecodingOptions.of(target=str(tiny_dir), draft="none", device="cpu", max_new_tokens=4))
    assert drafting.target.dtype == torch.bfloat16 and plain.target.dtype == torch.float32
    assert fake.estimated == ["float32", "bfloat16"]  # only the drafting session estimates
    line = next(line for line in said(capsys).splitlines() if "for speculative decoding" in line)
    packed = {c.dtype: c.packed for c in drafting.target.dtype_choice.candidates}["bfloat16"]
    label = "bfloat16 (packed linears)" if packed else "bfloat16"
    assert "bfloat16 (target forwards per token" in line and f"5.0 ms in {label} with a chain of 2" in line
    assert len(entries(cache)) == 2
    Session(DecodingOptions.of(target=str(tiny_dir), draft="ngram", device="cpu", max_new_tokens=4))
    assert len(fake.asked) == 2 and len(fake.estimated) == 2  # cached


def test_a_cached_speculative_entry_with_a_bad_estimate_is_measured_again(tiny_dir, probe, cache):
    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[11.0, 11.0, 11.0], per_token={"float32": 8.0, "bfloat16": 5.0})
    choose = lambda: tuning_dtype.choose(load_model(str(tiny_dir), device="cpu", dtype="float32"), speculative=True)
    assert choose().chosen == "bfloat16"
    [entry] = entries(cache)
    data = json.loads(entry.read_text())
    data["candidates"] = [{**c, "ms_per_token": -1.0} for c in data["candidates"]]
    entry.write_text(json.dumps(data))
    assert choose().chosen == "bfloat16" and len(fake.asked) == 2


def test_the_real_estimate_measures_and_caches_that_dtypes_curve(tiny_target, cache):
    """`speculative_cost` times the target in the dtype its weights hold now, caches the curve
    under that dtype's key (the session reuses it), and leaves the target's dtype as it was."""
    with tuning_weights.Weights(tiny_target.model) as weights:
        weights.use("bfloat16")
        ms, shape, complete, relative = tuning_dtype.speculative_cost(tiny_target, "bfloat16", 10.0)
    assert tiny_target.dtype == torch.float32 and complete
    assert relative["1"] == 1.0 and set(relative) == {str(width) for width in cost.ESTIMATE_WIDTHS}
    assert 0 < ms <= 10.0 and shape is not None  # never dearer per token than the plain step given
    key = curve.curve_key(tiny_target.fingerprint, tiny_target.device, torch.bfloat16, False, curve.CONTEXT_TOKENS)
    data = store.read_entry(store.cache_path(key, curve.FOLDER), cost.SCHEMA, key)
    assert data is not None and {int(width) for width in data["ms_by_width"]} == set(cost.ESTIMATE_WIDTHS)


# ----------------------------------------------------------------------------- mars profile --dtypes
def test_profile_dtypes_shows_the_table(tiny_dir, capsys, cache):
    from mars_cli.cli import main

    code = main(["profile", "abc abc", "--target", str(tiny_dir), "--device", "cpu", "-n", "4", "--draft", "none",
                 "--dtypes"])
    out = capsys.readouterr().out
    assert code == 0
    assert "plain decoding step by dtype" in out and "ms per step" in out and "usable" in out
    table = out[out.index("plain decoding step by dtype"):]
    assert "float32" in table and "bfloat16" in table and "yes (the reference)" in table
    assert out.count("← --dtype auto") == 1
    settled = read_entry(cache)["provisional"] is None
    assert ("cached for --dtype auto in" in out) == settled and ("cached as provisional" in out) == (not settled)
    from mars_cli.decoding import packing  # each dtype was timed as sessions run it: on packed linears where they can be

    for torch_dtype in (torch.float32, torch.bfloat16):
        label = f"{str(torch_dtype).replace('torch.', '')} (packed"
        assert (label in table) == (packing.problem(torch.nn.Linear(8, 8).to(torch_dtype)) is None)


def test_profile_dtypes_json_reports_the_measurement(tiny_dir, capsys, probe):
    from mars_cli.cli import main

    probe(float32=[10.0, 10.0, 10.0], bfloat16=[6.0, 6.0, 6.0])
    code = main(["profile", "abc abc", "--target", str(tiny_dir), "--device", "cpu", "-n", "4", "--draft", "none",
                 "--dtypes", "--dtype", "float32", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["config"]["dtype"] == "float32"  # an explicit dtype still decodes in it
    measured = report["dtypes"]
    assert measured["chosen"] == "bfloat16" and [c["dtype"] for c in measured["candidates"]] == ["float32", "bfloat16"]
    assert measured["candidates"][1]["ms_per_step"] == 6.0 and measured["provisional"] is None
    assert measured["cached"] is False  # measured afresh


def test_profile_dtypes_draws_each_candidates_curve_for_a_drafting_session(tiny_dir, capsys, probe):
    """Each candidate (a dtype, or a quantized layout) with the cost curve its drafting estimate
    stood on, side by side, in the table and in --json."""
    from mars_cli.cli import main

    probe(float32=[10.0, 10.0, 10.0], bfloat16=[6.0, 6.0, 6.0])
    code = main(["profile", "abc abc", "--target", str(tiny_dir), "--device", "cpu", "-n", "4", "--draft", "ngram",
                 "--dtypes"])
    out = capsys.readouterr().out
    assert code == 0 and "forward cost by width" in out and out.count("2: 1.25") == 2
    code = main(["profile", "abc abc", "--target", str(tiny_dir), "--device", "cpu", "-n", "4", "--draft", "ngram",
                 "--dtypes", "--json"])
    measured = json.loads(capsys.readouterr().out)["dtypes"]
    assert code == 0 and [c["curve"] for c in measured["candidates"]] == [{"1": 1.0, "2": 1.25}] * 2


@pytest.mark.parametrize("methods, speculative", [("vanilla", False), ("vanilla,strict", True)])
def test_eval_chooses_for_drafting_when_any_method_drafts(tiny_dir, probe, capsys, methods, speculative):
    """`mars eval` runs every method on one target: chosen for speculative decoding if one drafts."""
    from mars_cli.cli import main

    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[11.0, 11.0, 11.0], per_token={"float32": 8.0, "bfloat16": 5.0})
    code = main(["eval", "--suite", "math", "--limit", "1", "-n", "3", "--methods", methods, "--target",
                 str(tiny_dir), "--device", "cpu", "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and bool(fake.estimated) == speculative
    assert payload["config"]["dtype"] == ("bfloat16" if speculative else "float32")


# ----------------------------------------------------------------------------- packed bfloat16
def test_each_dtype_is_timed_on_packed_linears_when_asked(tiny_dir, monkeypatch, cache, capsys):
    from mars_cli.decoding import packing

    # where torch or the CPU cannot pack a dtype, it is timed dense, and says so
    can_pack = packing.problem(torch.nn.Linear(8, 8).to(torch.bfloat16)) is None
    can_pack_float32 = packing.problem(torch.nn.Linear(8, 8)) is None
    seen: dict[str, bool] = {}

    def time_steps(target, use, names, deadline=None):
        for name in names:
            use(name)
            seen[name] = packing.installed(target.model)
        return {name: [10.0 if name == "float32" else 6.0] * tuning_dtype.REPEATS for name in names}

    monkeypatch.setattr(tuning_dtype, "time_steps", time_steps)
    target = load_model(str(tiny_dir), device="cpu", dtype="float32")
    choice = tuning_dtype.choose(target, packed=True)
    assert seen == {"float32": can_pack_float32, "bfloat16": can_pack}
    assert {c.dtype: c.packed for c in choice.candidates} == {"float32": can_pack_float32, "bfloat16": can_pack}
    assert choice.key["packed"] is True and not packing.installed(target.model)
    assert {p.dtype for p in target.model.parameters()} == {torch.float32}  # left in float32, dense
    assert ("bfloat16 (packed linears)" in capsys.readouterr().err) == can_pack
    assert tuning_dtype.choose(target, packed=True).provenance.cached  # cached under its own key
    assert not tuning_dtype.choose(target, packed=False).provenance.cached
    assert seen == {"float32": False, "bfloat16": False}  # not asked: dense


def test_an_estimate_on_a_curve_cut_short_keeps_the_choice_provisional(tiny_dir, probe, cache):
    """A drafting session's dtypes compared on curves the budget cut short (chains only, say) may
    not be compared as a full curve would have them: the choice decides this run, provisional, and
    the next quiet run measures again."""
    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[6.0, 6.0, 6.0])
    fake.partial = {"bfloat16"}
    loaded = tuning_dtype.DtypeMeasurement(load_model(str(tiny_dir), device="cpu", dtype="float32"), speculative=True)
    first = loaded.measure(None)
    assert first.chosen == "bfloat16" and "cost curves of bfloat16" in first.provenance.provisional
    fake.partial = set()
    again = loaded.measure(None, first)  # the next run: its checks and steps stand, the curves go on
    assert again.provenance.provisional is None and len(fake.asked) == 1 and fake.estimated == ["bfloat16", "float32"] * 2
    assert [c.ms_per_step for c in again.candidates] == [c.ms_per_step for c in first.candidates]
    first.provenance.busy = True  # measured on a busy machine: nothing of it stands
    loaded.measure(None, first)
    assert len(fake.asked) == 2


@pytest.mark.parametrize("reached", [[], ["float32"], ["bfloat16"], ["float32", "bfloat16"]])
def test_a_re_measurement_cut_short_never_puts_a_settled_choice_back_on_float32(tiny_dir, probe, cache, reached):
    """The newcomer's trap: a settled bfloat16 (q4a8 on a GGUF) turned provisional by drift, then
    re-measured by a one-liner whose budget ran out, cut before each candidate's timing. A run that
    did not time the settled choice keeps it; one that timed both weighs them (here bfloat16 wins)."""
    fake = probe(float32=[10.0, 10.0, 10.0], bfloat16=[6.0, 6.0, 6.0])
    assert auto(tiny_dir).dtype == torch.bfloat16
    [path] = entries(cache)
    assert protocol.mark_provisional(path, "drift: plain decoding no longer matches")
    fake.blocks = 2  # cut short: the candidates it reached got two blocks each
    timed = fake.__call__

    def reaching(target, use, names, deadline=None):
        return {name: times for name, times in timed(target, use, names, deadline).items() if name in reached}

    tuning_dtype.time_steps = reaching  # restored by the probe fixture's monkeypatch
    again = auto(tiny_dir)
    assert again.dtype == torch.bfloat16 and read_entry(cache)["chosen"] == "bfloat16"
    assert again.dtype_choice.provenance.provisional is not None
