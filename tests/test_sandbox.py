"""The sandbox for generated code (`mars eval --allow-code-execution`): what it must hold where
the system can build it, and the one-line refusal where it cannot. Each attack checks its effect
from outside: no file appears, no process survives."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from mars_cli.cli import main
from mars_cli.errors import UserError
from mars_cli.evaluation import execution

ISOLATED = execution.isolation_problem() is None


def survivors(marker: str) -> list[str]:
    """Processes whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(entry.name)
            except OSError:
                continue
    return found


def run(source: str, timeout: float = 10.0) -> execution.Outcome:
    """Strict isolation where it exists; elsewhere the refusal is what must happen."""
    if not ISOLATED:
        with pytest.raises(execution.SandboxUnavailable):
            execution.run_program(source, timeout)
        pytest.fail(f"strict isolation is unavailable here ({execution.isolation_problem()}); "
                    "the refusal was checked, the attacks could not be")  # pragma: no cover
    return execution.run_program(source, timeout)


def test_writes_outside_the_temporary_directory_fail(tmp_path):
    os.chmod(tmp_path, 0o777)  # even a world-writable place outside stays out of reach
    targets = [tmp_path / "escaped", Path("/tmp") / f"mars-escaped-{uuid.uuid4().hex}",
               Path.home() / f"mars-escaped-{uuid.uuid4().hex}", Path.cwd() / f"mars-escaped-{uuid.uuid4().hex}"]
    source = "import os\nassert open('inside.txt', 'w').write('ok') == 2\nwritten = []\n"
    for target in targets:
        source += (f"try:\n    open({str(target)!r}, 'w').write('x')\n    written.append({str(target)!r})\n"
                   "except OSError:\n    pass\n")
    source += "assert not written, written\n"
    outcome = run(source)
    assert outcome.passed, outcome.reason  # its own directory is writable, nothing else
    assert not any(target.exists() for target in targets)


def test_a_forked_late_writer_never_writes_and_never_survives(tmp_path):
    os.chmod(tmp_path, 0o777)
    late = tmp_path / "late"
    marker = f"mars-late-{uuid.uuid4().hex}"
    source = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()  # leave the process group too\n"
        f"    os.execv('/bin/sh', ['sh', '-c', 'sleep 1.5; echo x > {late}; sleep 30', '{marker}'])\n"
        "time.sleep(0.3)\n"
    )
    assert run(source).passed
    assert run(source + "while True:\n    pass\n", timeout=1.5).reason == "timeout"
    time.sleep(2.0)  # past the moment the writer would have written
    assert not late.exists()
    assert survivors(marker) == []


def test_the_process_count_is_limited():
    marker = f"mars-bomb-{uuid.uuid4().hex}"
    source = (
        "import os, sys\n"
        "started = 0\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        if os.fork() == 0:\n"
        f"            os.execv('/bin/sleep', ['{marker}', '30'])  # the marker as its name\n"
        "        started += 1\n"
        "except OSError as exc:\n"
        "    sys.exit(f'stopped after {started}: {exc.strerror}')\n"
    )
    outcome = run(source)
    assert not outcome.passed and outcome.reason.startswith("stopped after")
    assert int(outcome.reason.split()[2].rstrip(":")) < execution.MAX_PROCESSES
    assert survivors(marker) == []


def test_sandboxed_program_is_an_unprivileged_user_without_network():
    source = ("import os, socket\nassert os.geteuid() != 0 or os.getuid() != 0\n"
              "assert all(name == 'lo' for _, name in socket.if_nameindex())\n"
              "assert sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, 2]\n")
    outcome = run(source)
    assert outcome.passed, outcome.reason


def test_without_isolation_code_runs_only_with_weak_sandbox(capsys, monkeypatch, tiny_dir):
    monkeypatch.setattr(execution, "isolation_problem", lambda: "unshare: Operation not permitted (EPERM)")
    with pytest.raises(UserError, match="--weak-sandbox"):
        execution.sandbox_mode(False)
    args = ["eval", "--suite", "code", "--limit", "1", "-n", "4", "--methods", "vanilla", "--target", str(tiny_dir),
            "--device", "cpu", "--allow-code-execution", "--json"]
    assert main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "cannot isolate generated code here" in err[0] and "--weak-sandbox" in err[0]
    assert main([*args, "--weak-sandbox"]) == 0
    captured = capsys.readouterr()
    assert "weaker isolation" in captured.err
    import json

    assert json.loads(captured.out)["table"]["code"][0]["task_metric"] is not None


# --------------------------------------------------------------------------- what the program can see
def listen(sock, heard: list[bytes], stop: threading.Event) -> None:
    """Accept and read whatever arrives until `stop`: what a host service would receive."""
    sock.settimeout(0.1)
    while not stop.is_set():
        try:
            connection, _ = sock.accept()
        except (socket.timeout, OSError):
            continue
        with connection:
            connection.settimeout(1.0)
            try:
                heard.append(connection.recv(1024) or b"<connected>")
            except OSError:
                heard.append(b"<connected>")


@pytest.mark.parametrize("kind", ["filesystem", "abstract"])
def test_host_unix_sockets_hear_nothing(tmp_path, kind):
    """A world-writable socket file under /tmp (as X11's and many daemons' are) and an abstract
    socket: the program can reach neither, and the listener hears nothing."""
    name = f"mars-sock-{uuid.uuid4().hex}"
    address = f"/tmp/{name}" if kind == "filesystem" else f"\0{name}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    if kind == "filesystem":
        os.chmod(address, 0o666)
    server.listen(4)
    heard: list[bytes] = []
    stop = threading.Event()
    thread = threading.Thread(target=listen, args=(server, heard, stop), daemon=True)
    thread.start()
    source = ("import socket, sys\n"
              "client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
              "try:\n"
              f"    client.connect({address!r})\n"
              "    client.sendall(b'secret')\n"
              "except OSError:\n"
              "    sys.exit(0)\n"
              "sys.exit('connected')\n")
    try:
        outcome = run(source)
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join()
        server.close()
        if kind == "filesystem":
            os.unlink(address)
    assert heard == [] and outcome.passed, (heard, outcome.reason)


def test_host_files_and_processes_are_out_of_sight(monkeypatch):
    """A 0644 file under /tmp, the test's own environment through /proc, the project folder, the
    home directories and the usual socket folders: none can be read, nothing of them exists."""
    marker = uuid.uuid4().hex
    secret = Path("/tmp") / f"mars-secret-{marker}"
    secret.write_text(marker)
    secret.chmod(0o644)
    monkeypatch.setenv("MARS_TEST_MARKER", marker)
    hidden = [str(secret), str(Path.cwd()), str(Path(execution.__file__).parent), "/home", "/run", "/var/run",
              "/var/tmp", "/dev/shm", "/etc/passwd", f"/proc/{os.getpid()}"]
    source = ("import glob, os, sys\n"
              f"present = [p for p in {hidden!r} if os.path.lexists(p)]\n"
              "leaks = []\n"
              "for path in glob.glob('/proc/*/environ'):\n"
              "    try:\n"
              "        if " + repr(marker.encode()) + " in open(path, 'rb').read():\n"
              "            leaks.append(path)\n"
              "    except OSError:\n"
              "        pass\n"
              "others = [name for name in os.listdir(os.path.dirname(os.getcwd())) if name != os.path.basename(os.getcwd())]\n"
              "sys.exit(f'{present} {leaks} {others}' if present or leaks or others else 0)\n")
    try:
        outcome = run(source)
    finally:
        secret.unlink()
    assert outcome.passed, outcome.reason


def test_the_programs_folder_has_a_quota():
    """Writing without end (300 files of 1 MiB) stops at the folder's quota, and nothing of it
    is left on the host."""
    source = ("import os, sys\n"
              "written = 0\n"
              "try:\n"
              "    for i in range(300):\n"
              "        with open(f'f{i}', 'wb') as handle:\n"
              "            handle.write(b'x' * (1 << 20))\n"
              "        written += 1\n"
              "except OSError as exc:\n"
              "    sys.exit(f'stopped after {written}: {exc.strerror}')\n")
    outcome = run(source)
    assert not outcome.passed and outcome.reason.startswith("stopped after"), outcome.reason
    assert int(outcome.reason.split()[2].rstrip(":")) <= execution.FOLDER_QUOTA_BYTES >> 20
