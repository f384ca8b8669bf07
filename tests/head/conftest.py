"""Each test a process of its own as far as a session's one tuning note goes (tuning/summary.py:
said once a process; records kept for `--json`)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def one_tuning_note(monkeypatch):
    from mars_cli.tuning import summary

    monkeypatch.setattr(summary, "STATE", summary._State())
