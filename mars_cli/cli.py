"""The `mars` command line: the commands by name, each loaded when it runs; the exit codes.

Each command's flags and body live in its own module (mars_cli/commands/), imported only when that
command runs (or its help is asked for), so `mars generate` imports no calibration, evaluation,
plotting or training code, and its warm path no torch at all.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Annotated

import typer
from typer.core import TyperCommand, TyperGroup

from . import __version__
from .commands import common
from .errors import StaticCacheFull, UserError
from .paths import DISK_FULL, release_outputs
from .terminal import shown

BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell shows for a reader that closed the pipe early
_tracebacks = False  # --debug: errors raise instead of becoming one line


@dataclass(frozen=True)
class Entry:
    module: str  # mars_cli.commands.<module>: defines `app`, a Typer app of this one command
    summary: str  # the line `mars --help` lists, without importing the module


COMMANDS: dict[str, Entry] = {
    "generate": Entry("generate", "Generate a continuation of PROMPT, streaming the text as it is decoded."),
    "calibrate": Entry("calibrate", "Fit per-model MARS thresholds per decoding mode (a bound, or measured "
                                    "quality) into a YAML profile."),
    "train-head": Entry("train_head", "Train an EAGLE-style draft head for a target on its own greedy answers "
                                      "(self-distillation)."),
    "tune": Entry("tune", "Measure every choice `auto` makes for the target on this machine, afresh, and cache "
                          "them."),
    "profile": Entry("profile", "Show where decoding time goes: time split, acceptance, margins, draft-length "
                                "sweep."),
    "eval": Entry("eval", "Compare decoding methods for speed and quality on benchmark suites; gate CI jobs on it."),
    "serve": Entry("serve", "Serve a target with vLLM's OpenAI-compatible server, drafts verified by MARS; "
                            "--local: the warm server for `mars generate`."),
}


class LazyCommands(TyperGroup):
    """A group whose commands are imported by name when first asked for."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return list(COMMANDS)

    listing = False  # while `mars --help` lists the commands: summaries only, nothing imported

    def get_command(self, ctx: typer.Context, name: str):  # type: ignore[override]
        entry = COMMANDS.get(name)
        if entry is None:
            return None
        if self.listing:
            return TyperCommand(name, help=entry.summary, short_help=entry.summary)
        module = importlib.import_module(f"{__package__}.commands.{entry.module}")
        command = typer.main.get_command(module.app)
        command.name = name
        return command

    def format_help(self, ctx, formatter) -> None:  # type: ignore[no-untyped-def]
        """`mars --help` lists the commands by their COMMANDS summaries, importing none of them."""
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


app = typer.Typer(
    name="mars",
    cls=LazyCommands,
    help="Margin-aware speculative decoding (MARS) for causal language models, offline-first.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback(invoke_without_command=True)
def root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    """Speculative decoding with margin-aware verification: generate, calibrate, profile, eval."""
    global _tracebacks
    _tracebacks = debug  # read by main() when a command fails
    if version:
        common.out.print(f"mars-cli {__version__}")
        raise typer.Exit()


# ----------------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map errors to the contract's exit codes (2 bad input, 130 interrupted)."""
    global _tracebacks
    args = sys.argv[1:] if argv is None else argv
    common.INVOCATION[:] = list(args)
    _tracebacks = False
    command = typer.main.get_command(app)
    with _counting_interrupts() as interrupts:
        try:
            return _run(command, args)
        except Exception:  # noqa: BLE001 - only to tell an interrupt a library re-raised as something else
            if not interrupts or _tracebacks:
                raise
            common.err.print("interrupted")  # e.g. transformers' lazy import, cut by Ctrl-C, raising RuntimeError
            return 130


@contextlib.contextmanager
def _counting_interrupts():
    """Count the SIGINTs received while the command runs (each still raises KeyboardInterrupt, as
    Python's own handler does): a Ctrl-C that a library catches and re-raises as another error is
    still an interruption, exit 130, not a traceback. Only the main thread can own the handler."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def interrupted(signum: int, frame: object) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        yield received
    finally:
        signal.signal(signal.SIGINT, previous)


def _run(command, args: list[str]) -> int:
    try:
        # typer turns Ctrl-C into Exit(130) and, in this mode, returns an Exit's code
        result = command.main(args=args, prog_name="mars", standalone_mode=False)
        code = result if isinstance(result, int) else 0
        if code == 130:
            common.err.print("interrupted")
        return code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.TyperException as exc:  # usage errors: click's own message, exit code 2
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        return getattr(exc, "exit_code", 2)
    except (typer.Abort, KeyboardInterrupt):
        common.err.print("interrupted")
        return 130
    except BrokenPipeError:
        return _closed_pipe()
    except SystemExit as exc:  # click turns EPIPE into exit(1), which the contract keeps for failed gates
        if isinstance(exc.__context__, OSError) and exc.__context__.errno == errno.EPIPE:
            return _closed_pipe()
        raise
    except UserError as exc:
        if _tracebacks:
            raise
        print(f"mars: error: {shown(str(exc))}{_advice(exc)}", file=sys.stderr)
        return 2
    except FloatingPointError as exc:
        if _tracebacks:
            raise
        print(f"mars: error: {shown(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in DISK_FULL or _tracebacks:
            raise
        where = f" writing {shown(str(exc.filename))}" if exc.filename else ""
        print(f"mars: error: {exc.strerror}{where}: free some space (or point --out, TMPDIR or MARS_CACHE "
              "elsewhere); what was written before is kept", file=sys.stderr)
        return 2
    finally:
        release_outputs()  # a command's outputs are its own until it ends (the process may go on: tests)


def _advice(error: UserError) -> str:
    """What the user can do about an error the decoding core raised in its own terms."""
    if isinstance(error, StaticCacheFull):
        return "; decode with --compile off"
    return ""


def _closed_pipe() -> int:
    """The reader of stdout went away (`mars generate ... | head -c 5`): stop quietly with 141,
    the status a shell reports for a process ended by SIGPIPE (128 + 13). Later flushes go to
    /dev/null so that the interpreter's exit prints nothing either."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
