"""Running generated code, only when the user opted in with --allow-code-execution.

Each program runs through the launcher in `jail.py`: a fresh `python -I -B` in a folder of its own
(a tmpfs of FOLDER_QUOTA_BYTES), with a minimal environment, no stdin, a wall-clock timeout,
CPU-time, memory, file-size, open-file and process-count limits, in a cgroup of its own where the
host lets one be made (MEMORY_LIMIT_BYTES for all its processes together), as an unprivileged user,
in private mount, PID, network and cgroup namespaces, under a root of its own that holds only what
Python needs to run (docs/errors.md lists what the sandbox holds; tests/evaluation/test_sandbox.py
checks each item). The launcher's process group is killed at the end of every run and on timeout,
and the PID namespace takes every process the program forked with it. Where the system cannot
build that isolation, code runs only with --weak-sandbox.

Whether the sandbox could be built is read from the launcher's status pipe only, never from what
the program printed or its exit status: a program cannot stop an eval by impersonating the
launcher, it fails its sample.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .jail import LAUNCHER_TASKS, PREFIX, STARTED, Cgroup
from ..notes import warn

MEMORY_LIMIT_BYTES = 1 << 30  # per process (RLIMIT_AS), and for all of them together where a cgroup holds
CPU_SECONDS = 10
FILE_SIZE_BYTES = 1 << 20
FOLDER_QUOTA_BYTES = 16 << 20  # all the program may write, in all files together
MAX_PROCESSES = 16  # the program and what it forks (threads count too)
OPEN_FILES = 64  # per process (RLIMIT_NOFILE): pipes and sockets hold kernel memory per descriptor
LAUNCHER = Path(__file__).with_name("jail.py")


@dataclass
class Outcome:
    passed: bool
    reason: str  # "passed", "failed", "timeout" or the first line of the error


class SandboxUnavailable(UserError):
    """Strict isolation cannot be built on this system (the reason is the message)."""


def _interpreter() -> list[str]:
    """What of the interpreter's installation the program's root holds: its binary, its standard
    library, and its lib folder where the installation is Python's own (pyenv, uv, conda: the
    shared libraries its modules link to), or only its shared library where the prefix is shared
    (/usr, /usr/local: not the site's other programs and settings). The real binary runs, not a
    virtual environment's link to it, so the environment's packages stay out of reach."""
    prefix, binary = os.path.realpath(sys.base_prefix), os.path.realpath(sys.executable)
    paths = [binary, os.path.realpath(os.path.dirname(os.__file__))]
    if prefix not in ("/", "/usr", "/usr/local"):
        paths.append(os.path.join(prefix, "lib"))
    elif sysconfig.get_config_var("Py_ENABLE_SHARED") and sysconfig.get_config_var("INSTSONAME"):
        library = os.path.join(prefix, "lib", sysconfig.get_config_var("INSTSONAME"))
        paths += [library, os.path.realpath(library)] if os.path.exists(library) else []
    paths = [path for path in dict.fromkeys(paths) if os.path.lexists(path)]
    return [path for path in paths if not any(path.startswith(other + "/") for other in paths)]


def _kill_group(pgid: int) -> None:
    """SIGKILL the program's whole process group; a group already gone needs nothing."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _printable(text: str) -> str:
    """`text` with control characters (escape sequences, C1 bytes) written as escapes."""
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)


def _drain(descriptor: int) -> str:
    """What the launcher wrote on the status pipe (every writer has closed it or is gone)."""
    os.set_blocking(descriptor, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(descriptor, 65536):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def run_program(source: str, timeout: float = 10.0, strict: bool = True) -> Outcome:
    """Run `source` in the sandbox. `strict=False` (--weak-sandbox) runs it with whatever part of
    the isolation the system allows; strict mode raises SandboxUnavailable when a step fails.
    Only the launcher's status pipe says that (its `mars-sandbox: ` lines, or no STARTED before it
    ended); the program's output and exit status are its own: a failed sample at worst."""
    cgroup = Cgroup.create(MEMORY_LIMIT_BYTES, MAX_PROCESSES + LAUNCHER_TASKS)
    with tempfile.TemporaryDirectory(prefix="mars-exec-") as folder, tempfile.TemporaryDirectory(prefix="mars-root-") \
            as stage, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        path = os.path.join(folder, "program.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(source)
        os.chmod(path, 0o644)
        said, status = os.pipe()  # the launcher's channel; the program never holds `status`
        config = {"strict": strict, "folder": folder, "program": path, "python": os.path.realpath(sys.executable),
                  "memory": MEMORY_LIMIT_BYTES, "cpu": CPU_SECONDS, "fsize": FILE_SIZE_BYTES,
                  "processes": MAX_PROCESSES, "files": OPEN_FILES, "quota": FOLDER_QUOTA_BYTES, "stage": stage,
                  "interpreter": _interpreter(), "status": status, "cgroup": cgroup.procs if cgroup else []}
        try:
            # stdout and stderr go to unlinked files, not pipes: a forked child that keeps them open
            # cannot hold the run past the program's own end
            try:
                launcher = subprocess.Popen([sys.executable, "-I", "-B", str(LAUNCHER)], cwd=folder,
                                            env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.PIPE, stdout=stdout,
                                            stderr=stderr, start_new_session=True, pass_fds=(status,))
            finally:
                os.close(status)
            try:
                with contextlib.suppress(BrokenPipeError):  # a launcher that died early says why on stderr
                    launcher.stdin.write(json.dumps(config).encode())
                    launcher.stdin.close()
                code = launcher.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                _kill_group(launcher.pid)  # whatever is left of the run, on timeout and after every run
                launcher.wait()
            verdict = _drain(said).splitlines()
        finally:
            os.close(said)
            if cgroup is not None:
                cgroup.remove()
        stderr.seek(0)
        errors = stderr.read().decode("utf-8", errors="replace")
    refusals = [line.removeprefix(PREFIX) for line in verdict if line.startswith(PREFIX)]
    if refusals:
        raise SandboxUnavailable(_printable(refusals[0]))
    if code is None:
        return Outcome(False, "timeout")
    lines = errors.strip().splitlines() or ["failed"]
    if STARTED not in verdict:  # the launcher ended without a word: its own failure, no program ran
        raise SandboxUnavailable(f"the launcher stopped before the program started (exit status {code}: "
                                 f"{_printable(lines[-1][:200])})")
    if code == 0:
        return Outcome(True, "passed")
    return Outcome(False, _printable(lines[-1][:200]))


@functools.lru_cache(maxsize=1)
def memory_cap() -> str:
    """What holds the total memory of a program's processes here: "cgroup v2" or "cgroup v1"
    (MEMORY_LIMIT_BYTES for all together), or "rlimits" (RLIMIT_AS per process, with the calls
    that hold memory outside it refused: at most MAX_PROCESSES times MEMORY_LIMIT_BYTES)."""
    cgroup = Cgroup.create(MEMORY_LIMIT_BYTES, MAX_PROCESSES + LAUNCHER_TASKS)
    if cgroup is None:
        return "rlimits"
    cgroup.remove()
    return cgroup.mechanism


@functools.lru_cache(maxsize=1)
def isolation_problem() -> str | None:
    """Why strict isolation cannot be built here, or None when it can (probed once)."""
    if not sys.platform.startswith("linux"):
        return "it needs Linux namespaces"
    try:
        probe = run_program("pass\n", timeout=30)
    except SandboxUnavailable as exc:
        return str(exc)
    return None if probe.passed else f"a probe program failed: {probe.reason}"


def sandbox_mode(weak_allowed: bool) -> bool:
    """True for strict isolation; False when the user accepted weaker isolation and strict is not
    available here (one warning line); a one-line refusal otherwise."""
    problem = isolation_problem()
    if problem is None:
        return True
    if not weak_allowed:
        raise UserError(f"cannot isolate generated code here ({problem}); pass --weak-sandbox to run it with "
                        "weaker isolation (process group, resource limits, nobody when root), or leave out "
                        "--allow-code-execution")
    weak_problem = _weak_problem()
    if weak_problem is not None:  # else every program would fail the same way: a silent score of 0
        raise UserError(f"cannot run generated code here, even with weaker isolation ({weak_problem}; strict "
                        f"isolation: {problem}); leave out --allow-code-execution")
    warn(f"running generated code with weaker isolation ({problem})")
    return False


@functools.lru_cache(maxsize=1)
def _weak_problem() -> str | None:
    """Why even --weak-sandbox cannot run a program here, or None when it can (probed once)."""
    try:
        probe = run_program("pass\n", timeout=30, strict=False)
    except SandboxUnavailable as exc:
        return str(exc)
    return None if probe.passed else f"a probe program failed: {probe.reason}"


def check_completion(prompt: str, completion: str, test: str, entry_point: str, timeout: float = 10.0,
                     strict: bool = True) -> Outcome:
    """HumanEval convention: prompt + completion, then the test's `check(entry_point)`."""
    program = f"{prompt}{completion}\n\n{test}\n\ncheck({entry_point})\n"
    return run_program(program, timeout, strict)


def check_function(code: str, test: str, timeout: float = 10.0, strict: bool = True) -> Outcome:
    """Built-in code suite: the generated code, then plain asserts."""
    return run_program(f"{code}\n\n{test}\n", timeout, strict)
