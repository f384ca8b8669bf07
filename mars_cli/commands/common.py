"""What the commands share: the two consoles, prompt reading, output-path checks, the progress bar
and the command line that reproduces a run. Light to import (no torch): `generate` starts here."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from ..errors import UserError, require
from ..notes import note

# Tables stay readable in logs and pipes too (rich assumes 80 columns when not on a terminal). No
# markup: a path or a model's text holding `[...]` is printed as it is (terminal.py).
out = Console(highlight=False, markup=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, markup=False)

# what `generate` reads of stdin at most: 2**20 tokens at a generous 64 bytes each (Session.encode then
# holds a prompt to its model's own window, in bytes, before tokenizing it)
MAX_PROMPT_BYTES = 64 << 20
INVOCATION: list[str] = []  # the arguments of this run (cli.main sets them), recorded in profiles for reproduction


def read_prompt(prompt: str | None) -> str:
    """The prompt argument, or stdin for `-` or none: valid UTF-8, not empty, bounded in size."""
    if prompt is None or prompt == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UserError("no prompt given: pass PROMPT or pipe it on stdin")
        data = sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1)  # never the whole of an endless or huge stream
        require(len(data) <= MAX_PROMPT_BYTES, f"the prompt on stdin is over {MAX_PROMPT_BYTES >> 20} MiB; no "
                                               "model's context window holds that much")
        try:
            prompt = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"stdin is not valid UTF-8 (byte {exc.start})") from None
    else:
        prompt = valid_utf8(prompt, "the prompt argument")
    if not prompt.strip():
        raise UserError("the prompt is empty")
    return prompt


def valid_utf8(text: str, what: str) -> str:
    """Arguments arrive decoded with surrogateescape: a lone surrogate marks a byte that is not
    UTF-8, which the tokenizer would fail on with a traceback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = len(text[:exc.start].encode("utf-8", "surrogateescape"))
        raise UserError(f"{what} is not valid UTF-8 (byte {byte})") from None
    return text


def check_writable_file(path: Path) -> None:
    """The file's directory must exist (or be creatable: its last level only, see
    paths.create_directory) and be writable."""
    import os

    from ..paths import check_can_create, create_directory

    require(not path.is_dir(), f"{path} is a directory; name a file")
    parent = path.parent if str(path.parent) else Path(".")
    create_directory(parent)
    require(os.access(parent, os.W_OK), f"cannot write to {parent}")
    # an existing file may refuse writes its directory allows (immutable, read-only bind)
    require(not path.exists() or os.access(path, os.W_OK), f"cannot write {path}: the file is not writable")
    check_can_create(parent, path)


def remove_leftovers(*paths: Path) -> None:
    """Temporaries a killed run left beside its outputs (the output is claimed: no one else writes
    them), removed with one note."""
    from .. import paths as files

    removed = sum(files.remove_leftovers(path) for path in paths)
    if removed:
        note(f"removed {removed} temporary file{'s' if removed > 1 else ''} an interrupted run left beside "
             f"{paths[0]}")


def progress_bar():
    """The progress bar long commands draw on stderr."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=err, transient=False)


def check_writable_profile(path: Path) -> None:
    """Fail before minutes of work, not after."""
    require(not path.is_dir(), f"--out {path} is a directory; name a .yaml file")
    require(path.suffix in (".yaml", ".yml"), f"--out {path}: a profile is a .yaml file")
    check_writable_file(path)


def reproduce_command(command: str) -> str:
    """The command line that reproduces this run: the args as given, quoted for a shell, less
    `--resume` (a resumed run reproduces the run it continues)."""
    import shlex

    args = INVOCATION
    start = args.index(command) if command in args else 0
    return "mars " + " ".join(shlex.quote(a) for a in args[start:] if a != "--resume")
