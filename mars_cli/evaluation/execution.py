"""Running generated code, only when the user opted in with --allow-code-execution.

Each program runs in a fresh Python subprocess (isolated mode, empty temporary directory,
minimal environment, no stdin) with a wall-clock timeout, CPU-time and memory limits, and, where
the system allows unprivileged network namespaces (`unshare -rn`), no network at all.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

MEMORY_LIMIT_BYTES = 1 << 30
CPU_SECONDS = 10


@dataclass
class Outcome:
    passed: bool
    reason: str  # "passed", "failed", "timeout" or the first line of the error


def _limits() -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    os.setsid()


@functools.lru_cache(maxsize=1)
def network_isolation_prefix() -> tuple[str, ...]:
    """`unshare -rn` when it works here (a private network namespace with no interfaces up)."""
    tool = shutil.which("unshare")
    if tool is None:
        return ()
    try:
        probe = subprocess.run([tool, "-rn", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (tool, "-rn") if probe.returncode == 0 else ()


def run_program(source: str, timeout: float = 10.0) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="mars-exec-") as folder:
        path = os.path.join(folder, "program.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(source)
        command = [*network_isolation_prefix(), sys.executable, "-I", "-B", path]
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "HOME": folder}
        try:
            done = subprocess.run(command, cwd=folder, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=timeout, preexec_fn=_limits)
        except subprocess.TimeoutExpired:
            return Outcome(False, "timeout")
    if done.returncode == 0:
        return Outcome(True, "passed")
    last = (done.stderr.strip().splitlines() or ["failed"])[-1]
    return Outcome(False, last[:200])


def check_completion(prompt: str, completion: str, test: str, entry_point: str, timeout: float = 10.0) -> Outcome:
    """HumanEval convention: prompt + completion, then the test's `check(entry_point)`."""
    program = f"{prompt}{completion}\n\n{test}\n\ncheck({entry_point})\n"
    return run_program(program, timeout)


def check_function(code: str, test: str, timeout: float = 10.0) -> Outcome:
    """Built-in code suite: the generated code, then plain asserts."""
    return run_program(f"{code}\n\n{test}\n", timeout)
