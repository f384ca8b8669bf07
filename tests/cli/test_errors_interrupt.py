"""Ctrl-C during the first seconds (issue 67, item 11): a command's imports happen inside `main`
(the command modules are loaded on demand), so an interrupt there exits 130 with one line, on a
real process started as the console script starts it (`sys.exit(mars_cli.entry.main())`), whose
handler covers the command line's own imports (typer, rich)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The console script's body, with an import hook that sends this process SIGINT the moment the
# named module starts importing: an interrupt at exactly that point, on every run
INTERRUPTED_AT = """
import importlib.abc, os, signal, sys
class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == os.environ["INTERRUPT_AT"]:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Interrupt())
from mars_cli.entry import main
sys.exit(main())
"""


def environment(**extra: str) -> dict:
    return {**os.environ, "MARS_SERVER": "off", "PYTHONPATH": str(ROOT), **extra}


def interrupted_at(module: str, tiny_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", INTERRUPTED_AT, "generate", "Hello", "-n", "2", "--target",
                           str(tiny_dir), "--device", "cpu"], env=environment(INTERRUPT_AT=module),
                          capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("module", ["mars_cli.commands.generate", "torch", "transformers"])
def test_ctrl_c_while_a_command_imports_exits_130_quietly(tiny_dir, module):
    done = interrupted_at(module, tiny_dir)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "interrupted\n" and done.stdout == ""


def test_ctrl_c_shortly_after_a_real_start_exits_130_quietly(tiny_dir):
    """SIGINT a second or two after `python -m mars_cli.cli generate` starts: while it imports
    torch and transformers or loads the model."""
    for delay in (1.0, 2.0):
        process = subprocess.Popen([sys.executable, "-m", "mars_cli.cli", "generate", "Hello", "-n", "64",
                                    "--target", str(tiny_dir), "--device", "cpu"], env=environment(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        if process.poll() is not None:  # done already (a fast machine): nothing was interrupted
            process.communicate()
            continue
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
        assert process.returncode == 130, (delay, err)
        assert "Traceback" not in err and err.strip().splitlines()[-1:] == ["interrupted"], (delay, err)


def test_ctrl_c_while_the_entry_point_itself_imports(tiny_dir):
    done = interrupted_at("typer", tiny_dir)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr


def test_a_ctrl_c_a_library_re_raises_as_another_error_still_exits_130(tiny_dir, capsys, monkeypatch):
    """transformers' lazy imports, cut by a SIGINT, can surface as a RuntimeError ("Could not import
    module ..."): still an interruption, one line and 130, not a traceback."""
    import mars_cli.models
    from mars_cli.cli import main

    def interrupted_load(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            raise RuntimeError("Could not import module 'LlamaForCausalLM'") from None

    monkeypatch.setattr(mars_cli.models, "load_model", interrupted_load)
    code = main(["generate", "Hello", "-n", "2", "--target", str(tiny_dir), "--device", "cpu"])
    captured = capsys.readouterr()
    assert code == 130 and "interrupted" in captured.err and "Traceback" not in captured.err
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back as it was


def test_an_error_with_no_interrupt_is_still_raised(tiny_dir, monkeypatch):
    import mars_cli.models
    from mars_cli.cli import main

    def broken_load(*args, **kwargs):
        raise RuntimeError("a real bug")

    monkeypatch.setattr(mars_cli.models, "load_model", broken_load)
    with pytest.raises(RuntimeError, match="a real bug"):
        main(["generate", "Hello", "-n", "2", "--target", str(tiny_dir), "--device", "cpu"])
