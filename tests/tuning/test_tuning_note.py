"""A first run says in ONE note what its tuning measured and what stays provisional
(mars_cli/tuning/summary.py), not one two-line note per measured choice: a session records each
choice's own line (kept for `--json`'s `tuning.notes`) and says the summary when decoding starts,
once a process (eval and calibrate build several sessions); outside a session each choice's own
note is said as before (tests/tuning/test_dtype_choice.py, test_cost_first_use.py)."""

from __future__ import annotations

import json

import pytest

from mars_cli.options import DecodingOptions
from mars_cli.session import Session
from mars_cli.tuning import clock, summary
from mars_cli.tuning import dtype as tuning_dtype
from mars_cli.tuning.choice import Provenance
from tests.cli.test_cli import run_cli
from tests.tuning.test_dtype_choice import Probe

FIRST = "mars: note: first run of this model on this machine: "


@pytest.fixture(autouse=True)
def exact_auto_dtype(monkeypatch):
    """Overrides conftest's fixture of this name: here `--dtype auto` measures, on a fixed probe."""
    fake = Probe({"float32": [10.0, 10.0, 10.0], "bfloat16": [11.0, 11.0, 11.0]}, {"float32": 8.0, "bfloat16": 9.0})
    monkeypatch.setattr(tuning_dtype, "time_steps", fake)
    monkeypatch.setattr(tuning_dtype, "speculative_cost", fake.estimate)
    return fake


@pytest.fixture
def ample_budget(monkeypatch):
    """Measuring that always ends in full (a loaded test machine could cut the curve short, and so
    make it provisional)."""
    monkeypatch.setattr(clock, "BUDGET", clock.unbounded())


def tuning_notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("mars: note:") and "this machine" in line]


def a_new_process(monkeypatch) -> None:
    """What a new `mars` process starts with: its own budget (ample) and nothing said yet."""
    monkeypatch.setattr(clock, "BUDGET", clock.unbounded())
    monkeypatch.setattr(summary, "STATE", summary._State())


# ----------------------------------------------------------------------------- one line a process
def test_a_first_run_on_a_fresh_cache_prints_exactly_one_tuning_note(capsys, tiny_dir, cache, monkeypatch,
                                                                     ample_budget):
    code, out, err = run_cli(capsys, "generate", "abc abc", "--target", str(tiny_dir), "--device", "cpu", "--json",
                             "-n", "8")
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("mars: note:")]
    assert len(notes) == 1 and notes[0].startswith(FIRST), err  # one line, and no other note
    assert "dtype (float32)" in notes[0] and "cost curve" in notes[0] and "cached for later runs" in notes[0]
    assert "provisional" not in notes[0]  # a quiet machine (conftest), measured in full: settled
    details = json.loads(out)["tuning"]["notes"]  # each choice's own line, for scripts
    assert any(line.startswith("--dtype auto for speculative decoding: float32") for line in details)
    assert any(line.startswith("the target's forward cost at widths") for line in details)
    a_new_process(monkeypatch)  # the next run reads every entry: nothing to say
    code, out, err = run_cli(capsys, "generate", "abc abc", "--target", str(tiny_dir), "--device", "cpu", "--json",
                             "-n", "8")
    assert code == 0 and tuning_notes(err) == [] and json.loads(out)["tuning"]["notes"] == []


def test_a_busy_first_run_says_its_choices_are_provisional_in_the_one_line(capsys, tiny_dir, cache, monkeypatch):
    import os

    from mars_cli.tuning import machine

    load = machine.usable_cores() + 8.0
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    code, _, err = run_cli(capsys, "generate", "abc abc", "--target", str(tiny_dir), "--device", "cpu", "-n", "8")
    assert code == 0, err
    [line] = tuning_notes(err)
    assert line.startswith(FIRST + "dtype (float32) and cost curve provisional (load average ")
    assert line.endswith("a busy machine): measured on a later run on a quiet machine (`mars tune` measures them now)")
    a_new_process(monkeypatch)  # still busy: the provisional entries are used, and said so in one line
    code, _, err = run_cli(capsys, "generate", "abc abc", "--target", str(tiny_dir), "--device", "cpu", "-n", "8")
    [line] = tuning_notes(err)
    assert line.startswith("mars: note: tuning for this machine: dtype (float32) and cost curve provisional (")


def test_sessions_of_one_process_say_it_once(tiny_target, cache, capsys, ample_budget):
    """eval builds a session per method, then decodes: the first decode says what all measured."""
    tree = Session(DecodingOptions.of(draft="ngram", draft_topk="auto", max_new_tokens=4), target=tiny_target)
    chain = Session(DecodingOptions.of(draft="ngram", draft_topk=1, max_new_tokens=4), target=tiny_target)
    assert capsys.readouterr().err == ""  # built: nothing said yet
    chain.run([4, 5, 6, 4, 5])  # its chain widths measured now, said with the tree's
    tree.run([4, 5, 6, 4, 5])
    later = Session(DecodingOptions.of(draft="ngram", draft_topk=1, num_draft="3", max_new_tokens=4),
                    target=tiny_target)
    later.run([4, 5, 6, 4, 5])
    err = capsys.readouterr().err
    assert tuning_notes(err) == [FIRST + "measured cost curve, cached for later runs"], err


# ----------------------------------------------------------------------------- the line
def record(label: str, value: str | None, provisional: str | None = None, *, new: bool = True, busy: bool = False,
           decides: bool = True) -> summary.Record:
    provenance = Provenance(provisional=provisional, busy=busy) if decides else None
    return summary.Record(label, value, f"{label}'s own line", provenance, None, new)


def test_the_line_names_what_was_measured_and_what_stays_provisional():
    measured = [record("dtype", "bfloat16"), record("packed linears", "on"), record("cost curve", None)]
    assert summary.line(measured) == ("first run of this model on this machine: measured dtype (bfloat16), "
                                      "packed linears (on) and cost curve, cached for later runs")
    mixed = [record("dtype", "float32"), record("cost curve", None),
             record("packed linears", "off", "not measured: this process's measuring budget was spent"),
             record("int8 head", "off", "not measured: this process's measuring budget was spent")]
    assert summary.line(mixed) == (
        "first run of this model on this machine: measured dtype (float32) and cost curve; packed linears (off) and "
        "int8 head (off) provisional (not measured: this process's measuring budget was spent): measured on a later "
        "run on a quiet machine (`mars tune` measures them now)")


def test_a_busy_machine_is_said_once_and_a_later_run_is_no_first_run():
    busy = [record("dtype", "float32", "load average 4.1 on 2 cores: a busy machine", new=False, busy=True),
            record("cost curve", None, "load average 4.2 on 2 cores: a busy machine", new=False, busy=True)]
    assert summary.line(busy) == ("tuning for this machine: dtype (float32) and cost curve provisional (load average "
                                  "4.1 on 2 cores: a busy machine): measured on a later run on a quiet machine "
                                  "(`mars tune` measures them now)")
    many = [record(f"choice {n}", None, f"a reason long enough to crowd the line, number {n}") for n in range(5)]
    assert "(a reason" not in summary.line(many)  # too many reasons for one line: `--json` has them


def test_a_choice_measured_twice_is_named_once_with_its_latest_state():
    again = [record("cost curve", None, "the measuring ran out of its budget"), record("dtype", "float32"),
             record("cost curve", None, new=False)]
    assert summary.line(again) == ("first run of this model on this machine: measured dtype (float32) and cost "
                                   "curve, cached for later runs")


def test_a_detail_changes_a_measured_choice_but_says_nothing_alone():
    follows = record("packed linears", "on", decides=False)  # packed, as --dtype auto timed it
    assert summary.line([follows]) is None
    assert summary.line([record("packed linears", "off"), follows]) == (
        "first run of this model on this machine: measured packed linears (on), cached for later runs")


def test_outside_a_session_each_choice_says_its_own_line_and_a_process_that_never_decodes_says_it_at_exit(capsys):
    summary.announce(record("dtype", "float32"))
    assert capsys.readouterr().err == "mars: note: dtype's own line\n"
    with summary.collecting():  # mars train-head: the target loads under --dtype auto, no session decodes
        summary.announce(record("dtype", "float32"))
    assert capsys.readouterr().err == ""
    summary._at_exit()
    assert capsys.readouterr().err == f"{FIRST}measured dtype (float32), cached for later runs\n"
    with summary.collecting(session=True):  # a session's records: what it never decoded with goes unsaid
        summary.announce(record("cost curve", None))
    summary._at_exit()
    assert capsys.readouterr().err == ""
