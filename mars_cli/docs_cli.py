"""Render the `mars` command line as markdown: docs/cli.md, generated, never edited by hand.

    python -m mars_cli.docs_cli > docs/cli.md      (or: make cli-docs)

Each command's help, usage, arguments and options (names, type, default, help), grouped by the
panels `mars COMMAND --help` shows, read from the Typer app through its click command tree. The
output depends on the code alone (no terminal width, no environment), so tests/cli/test_docs.py can
compare it with the committed page. The narrative around the flags lives in docs/reference.md,
one section a command under the same heading (`## \`mars NAME\``), which each command here links
to: `make docs` (mkdocs --strict) fails when a command has none.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from enum import Enum

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from .cli import app

COMMAND = "python -m mars_cli.docs_cli > docs/cli.md"
ARGUMENTS = "Arguments"  # typer's panel titles for parameters without a rich_help_panel
OPTIONS = "Options"

Command = TyperCommand | TyperGroup
Param = TyperArgument | TyperOption


def command_tree() -> Command:
    """The click command tree typer builds from the app (a group: `mars` and its commands)."""
    return typer.main.get_command(app)


def walk(group: Command, ctx: typer.Context | None = None,
         ) -> Iterator[tuple[Command, typer.Context]]:
    """The command and every subcommand below it, depth first, with a context for each."""
    ctx = ctx or typer.Context(group, info_name=group.name or "mars", **group.context_settings)
    yield group, ctx
    if isinstance(group, TyperGroup):
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if command is not None and not command.hidden:
                sub = typer.Context(command, info_name=name, parent=ctx, **command.context_settings)
                yield from walk(command, sub)


def _cell(text: str) -> str:
    """One markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _paragraphs(text: str) -> str:
    """A help text as markdown paragraphs (single line breaks join lines, as --help shows them)."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n") if p.strip())


def _type(param: Param, ctx: typer.Context) -> str:
    """`flag` for an on/off switch, else the value's type as --help shows it (`str`, `int`, `path`)."""
    if getattr(param, "is_flag", False) and not getattr(param, "secondary_opts", None):
        return "flag"
    shown = getattr(param, "display_type_rich", None)  # what --help shows: <str>, <int>, <path>
    name = shown(ctx=ctx) if shown is not None else None
    return (name or param.type.name).strip("<>")


def _default(param: Param) -> str:
    """The default as --help shows it; empty where it shows none (None, a flag that is off)."""
    show = getattr(param, "show_default", True)
    if isinstance(show, str):
        return show
    value = param.default
    if show is False or value is None or callable(value) or (getattr(param, "is_flag", False) and not value):
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v.value if isinstance(v, Enum) else v) for v in value)
    return str(value.value if isinstance(value, Enum) else value)


def _names(param: Param) -> str:
    """An argument's name, or an option's names, long first: `--target`, `-t`."""
    if isinstance(param, TyperArgument):
        return f"`{getattr(param, 'display_name_raw', None) or param.metavar or param.name}`"
    names = sorted(param.opts, key=lambda name: (not name.startswith("--"), name))
    return ", ".join(f"`{name}`" for name in names + list(param.secondary_opts))


def panels(command: Command, ctx: typer.Context) -> dict[str, list[Param]]:
    """Parameters by help panel, in the order --help prints them: arguments, options, then the
    named panels as they first appear."""
    found: dict[str, list[Param]] = {ARGUMENTS: [], OPTIONS: []}
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        panel = getattr(param, "rich_help_panel", None)
        panel = panel or (ARGUMENTS if isinstance(param, TyperArgument) else OPTIONS)
        found.setdefault(panel, []).append(param)
    return {panel: params for panel, params in found.items() if params}


def _table(params: list[Param], ctx: typer.Context) -> list[str]:
    rows = ["| name | type | default | help |", "|---|---|---|---|"]
    for param in params:
        default = _default(param)
        rows.append(f"| {_names(param)} | `{_type(param, ctx)}` | {_cell(f'`{default}`' if default else '')} "
                    f"| {_cell(getattr(param, 'help', None) or '')} |")
    return rows


def render_command(command: Command, ctx: typer.Context) -> list[str]:
    """One command's section: help, usage, a table per panel, and its subcommands or its link."""
    path = ctx.command_path
    lines = [f"## `{path}`", ""]
    if command.help:
        lines += [_paragraphs(command.help), ""]
    usage = " ".join(command.collect_usage_pieces(ctx))
    lines += ["```text", f"{path} {usage}".rstrip(), "```", ""]
    for panel, params in panels(command, ctx).items():
        lines += [f"**{panel}**", "", *_table(params, ctx), ""]
    if isinstance(command, TyperGroup):
        lines += ["**Commands**", ""]
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                anchor = f"{path} {name}".replace(" ", "-")
                lines.append(f"- [`{path} {name}`](#{anchor}): {sub.get_short_help_str(limit=10_000)}")
        lines.append("")
    elif ctx.parent is not None:
        lines += [f"More on `{path}`: [reference.md](reference.md#{path.replace(' ', '-')}).", ""]
    return lines


def render() -> str:
    """The whole page, ending in one newline."""
    lines = [
        f"<!-- Generated from mars_cli/cli.py by `{COMMAND}` (make cli-docs); do not edit. -->",
        "# CLI reference",
        "",
        f"Generated from the `mars` command itself by `{COMMAND}` (`make cli-docs`); "
        "`tests/cli/test_docs.py` fails when this page and the code disagree. Every command and flag with its "
        "type, default and help, grouped as `mars COMMAND --help` shows them. Output formats, the "
        "environment, exit codes and the flags in depth: [reference.md](reference.md).",
        "",
    ]
    for command, ctx in walk(command_tree()):
        lines += render_command(command, ctx)
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
