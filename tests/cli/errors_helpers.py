"""The error matrix's check (tests/cli/test_errors_*.py): a command run through the real entry point
must give exit code 2 and one line on stderr naming the problem, with no traceback."""

from __future__ import annotations

from mars_cli.cli import main


def one_line_error(capsys, args: list[str], expected: str) -> None:
    code = main(args)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2, (code, captured.err)
    assert len(lines) == 1 and expected in lines[0], captured.err
    assert "Traceback" not in captured.err


MODEL = ["--device", "cpu"]
