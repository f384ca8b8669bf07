"""The terminal shows text, not commands (mars_cli/terminal.py): a model's escape sequences, a path
holding rich markup and notes echoing arguments are printed as visible text."""

from __future__ import annotations

import shutil

from hypothesis import given
from hypothesis import strategies as st

from mars_cli.cli import main
from mars_cli.terminal import shown

CONTROLS = [chr(c) for c in range(0x20) if chr(c) not in "\t\n"] + [chr(0x7F)] + [chr(c) for c in range(0x80, 0xA0)]


@given(st.text(alphabet=st.sampled_from(CONTROLS + list("ab[]/\t\n é"))))
def test_nothing_a_terminal_obeys_survives(text):
    out = shown(text)
    assert not any(ch in out for ch in CONTROLS)
    assert out.replace("\\x", "") .count("\n") == text.count("\n")  # newlines and tabs kept as they are
    assert shown(out) == out  # already shown: unchanged


def test_streamed_text_escapes_what_a_model_emits(capsys):
    from mars_cli.commands.generate import _render

    events = [{"delta": "copy \x1b]52;c;ZWNobyBoaQ==\x07"}, {"delta": "csi \x9b31m red\n\ttab"}, {"ended": True},
              {"done": {"stats": {}, "config": {}}}]
    _render(iter(events), as_json=False, show_stats=False, server=None)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert "\\x1b]52;c;ZWNobyBoaQ==\\x07" in out and "\\x9b31m red\n" in out and out.rstrip().endswith("tab")


def test_a_path_holding_markup_is_shown_as_it_is(capsys, tmp_path, tiny_dir):
    target = tmp_path / "m[" / "b]x"  # `[/b]` in the path: a closing tag to rich
    shutil.copytree(tiny_dir, target)
    code = main(["generate", "Hi", "--target", str(target), "-n", "3", "--device", "cpu", "--dtype", "float32",
                 "--draft", "none", "--stats"])
    captured = capsys.readouterr()
    assert code == 0 and "target / draft" in captured.err, captured.err  # no MarkupError


def test_table_cells_and_titles_read_no_markup():
    from rich.console import Console

    from mars_cli.render import Table

    table = Table(title="suite: [bold]x[/b]")
    table.add_column("what")
    table.add_row("m[/]x.gguf \x1b[2J")
    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    console.print(table)
    text = console.export_text()
    assert "suite: [bold]x[/b]" in text and "m[/]x.gguf \\x1b[2J" in text


def test_notes_escape_what_they_echo(capsys):
    from mars_cli import notes

    notes.note("a file named \x1b[31mred\x1b[0m")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[31mred" in err


def test_error_lines_escape_the_arguments_they_echo(capsys):
    code = main(["generate", "Hi", "--target", "no-such-model-\x1b]52;c;AAAA\x07", "-n", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "\x1b" not in err and "\\x1b]52;c;AAAA\\x07" in err and len(err.strip().splitlines()) == 1
