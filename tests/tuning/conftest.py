"""Each test a process of its own as far as a session's one tuning note goes (tuning/summary.py:
said once a process; records kept for `--json`)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def one_tuning_note(monkeypatch):
    from mars_cli.tuning import summary

    monkeypatch.setattr(summary, "STATE", summary._State())


def said(capsys) -> str:
    """What was said since the last call: stderr, then the choices' own lines that a session's
    tuning records for its one note instead of printing them (tuning/summary.py)."""
    from mars_cli.tuning import summary

    lines = capsys.readouterr().err.strip().splitlines() + [record.detail for record in summary.STATE.records]
    summary.STATE.records.clear()
    return "\n".join(lines)
