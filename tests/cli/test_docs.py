"""The docs: docs/cli.md is what mars_cli.docs_cli generates from the code, and names every flag;
the README's links into docs/ reach a page and a heading (mkdocs, `make docs`, checks the pages
among themselves, but not the README, which is not one of them)."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from mars_cli import docs_cli
from mars_cli.cli import app

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli.md"


def test_committed_cli_page_is_the_generated_one():
    assert PAGE.read_text(encoding="utf-8") == docs_cli.render(), (
        f"docs/cli.md is stale: regenerate it with `make cli-docs` (or `{docs_cli.COMMAND}`) and commit it")


def test_generated_page_names_every_option_of_every_command():
    page = docs_cli.render()
    group = typer.main.get_command(app)
    ctx = typer.Context(group, info_name="mars", **group.context_settings)
    commands = [(group, ctx)] + [
        (command, typer.Context(command, info_name=name, parent=ctx, **command.context_settings))
        for name in group.list_commands(ctx) if (command := group.get_command(ctx, name)) is not None]
    assert len(commands) > 5
    for command, sub in commands:
        assert f"## `{sub.command_path}`" in page
        section = page.split(f"## `{sub.command_path}`\n", 1)[1].split("\n## ", 1)[0]
        for param in command.get_params(sub):
            if param.param_type_name == "option" and not param.hidden:
                assert f"`{param.opts[0]}`" in section, f"{sub.command_path}: {param.opts[0]} missing"


def _slug(heading: str) -> str:
    """GitHub's heading anchor, which mkdocs.yml's slugify reproduces."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_readme_links_into_docs_resolve():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\((docs/[^)\s]+)\)", readme):
        path, _, anchor = target.partition("#")
        assert (ROOT / path).is_file(), f"README.md links to {path}, which does not exist"
        if anchor:
            text = re.sub(r"^```.*?^```", "", (ROOT / path).read_text(encoding="utf-8"), flags=re.S | re.M)
            headings = {_slug(h) for h in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M)}
            assert anchor in headings, f"README.md links to {target}: {path} has no heading #{anchor}"
