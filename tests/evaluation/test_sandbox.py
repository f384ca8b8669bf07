"""The sandbox for generated code (`mars eval --allow-code-execution`): what it must hold where
the system can build it, and the one-line refusal where it cannot. Each attack checks its effect
from outside: no file appears, no process survives."""

from __future__ import annotations

import json
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
    """Interfaces by index (if_nameindex needs netlink, which is refused): a loopback that is down
    and nothing else; a PID namespace of its own (the test's process cannot be signalled)."""
    source = ("import fcntl, os, socket, struct, sys\nassert os.geteuid() != 0 or os.getuid() != 0\n"
              "probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
              "names = {}\n"
              "for index in range(1, 64):\n"
              "    try:\n"
              "        request = fcntl.ioctl(probe, 0x8910, struct.pack('16si20x', b'', index))  # SIOCGIFNAME\n"
              "    except OSError:\n"
              "        continue\n"
              "    names[index] = request[:16].rstrip(b'\\0').decode()\n"
              "assert names == {1: 'lo'}, names\n"
              "flags = struct.unpack('16sh', fcntl.ioctl(probe, 0x8913, struct.pack('16sh22x', b'lo', 0))[:18])[1]\n"
              "assert not flags & 1, flags  # IFF_UP\n"
              f"try:\n    os.kill({os.getpid()}, 0)\nexcept ProcessLookupError:\n    pass\n"
              "else:\n    sys.exit('the test process is in sight')\n"
              "assert os.getpid() <= 3, os.getpid()\n")
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


# --------------------------------------------------------------------------- the kernel surface
def system_call(name: str) -> int:
    """This machine's number for a system call, as the sandbox's filter resolves it."""
    seccomp = pytest.importorskip("pyseccomp")
    return seccomp.resolve_syscall(seccomp.system_arch(), name)


DOORS = {  # what each call does when it gets through: all must be refused
    "add_key": "libc.syscall({add_key}, b'user', b'mars-door', b'secret', 6, ctypes.c_int(-4))",  # @u: outlives runs
    "keyctl": "libc.syscall({keyctl}, 1, None)",  # KEYCTL_JOIN_SESSION_KEYRING: leave the fresh one
    "request_key": "libc.syscall({request_key}, b'user', b'mars-door', None, ctypes.c_int(-4))",
    "io_uring_setup": "libc.syscall({io_uring_setup}, 4, ctypes.create_string_buffer(120))",
    "userfaultfd": "libc.syscall({userfaultfd}, 1)",  # UFFD_USER_MODE_ONLY
    "unshare": "libc.syscall({unshare}, 0x10000000)",  # CLONE_NEWUSER
    "clone": "libc.syscall({clone}, 0x10000000 | 17, None, None, None, None)",  # a child in a new user namespace
}


@pytest.mark.parametrize("door", sorted(DOORS))
def test_the_kernel_surface_is_closed(door):
    """Each call container runtimes refuse by default is refused inside (EPERM), and the refusal
    is the filter's: the same call would reach the kernel outside."""
    numbers = {name: system_call(name) for name in ("add_key", "keyctl", "request_key", "io_uring_setup",
                                                   "userfaultfd", "unshare", "clone")}
    call = DOORS[door].format(**numbers)
    source = ("import ctypes, errno, os, sys\n"
              "libc = ctypes.CDLL(None, use_errno=True)\n"
              f"result = {call}\n"
              "if result == 0:\n"
              "    os._exit(0)  # a clone child in its new namespace\n"
              "code = ctypes.get_errno()\n"
              "sys.exit(0 if result < 0 and code == errno.EPERM else f'{result} {errno.errorcode.get(code)}')\n")
    outcome = run(source)
    assert outcome.passed, f"{door}: {outcome.reason}"


def test_a_key_from_one_run_never_reaches_the_next():
    """Two runs, as two generated programs would be: what the first tries to leave in the
    keyrings (session, user, user-session) the second cannot find: the keyring calls are refused."""
    numbers = {name: system_call(name) for name in ("add_key", "request_key")}
    writer = ("import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              f"added = [libc.syscall({numbers['add_key']}, b'user', b'mars-channel', b'x', 1, ctypes.c_int(ring))"
              " for ring in (-3, -4, -5)]\n"
              "sys.exit(0 if all(key < 0 for key in added) else f'added {added}')\n")
    reader = ("import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              f"found = libc.syscall({numbers['request_key']}, b'user', b'mars-channel', None, 0)\n"
              "keys = open('/proc/keys').read() if __import__('os').path.exists('/proc/keys') else ''\n"
              "sys.exit(0 if found < 0 and 'mars-channel' not in keys else f'found {found}')\n")
    assert run(writer).passed
    assert run(reader).passed


def test_netlink_sockets_are_refused():
    source = ("import socket, sys\n"
              "try:\n"
              "    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)\n"
              "except OSError:\n"
              "    sys.exit(0)\n"
              "sys.exit('a netlink socket opened')\n")
    outcome = run(source)
    assert outcome.passed, outcome.reason


def test_a_setuid_binary_gains_nothing():
    """no_new_privs and the filter are in place, and a setuid-root program found inside runs as
    the program's own user: its process, read before it is reaped, has no uid 0."""
    binaries = [str(path) for path in (Path("/usr/bin/su"), Path("/usr/bin/passwd"), Path("/usr/bin/mount"))
                if path.exists() and path.stat().st_mode & 0o4000 and path.stat().st_uid == 0]
    if not binaries:
        pytest.skip("no setuid-root binary under /usr/bin on this system")
    source = ("import ctypes, subprocess, sys\n"
              "libc = ctypes.CDLL(None, use_errno=True)\n"
              "modes = libc.prctl(39, 0, 0, 0, 0), libc.prctl(21, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS, PR_GET_SECCOMP\n"
              "assert modes == (1, 2), modes  # no_new_privs, a seccomp filter\n"
              f"for binary in {binaries!r}:\n"
              "    # the loader prints the aux vector (the uid the kernel gave) only for an exec that is not\n"
              "    # privileged (AT_SECURE 0); an honoured setuid exec prints nothing\n"
              "    shown = subprocess.run([binary, '--version'], env={'LD_SHOW_AUXV': '1'}, stdin=subprocess.DEVNULL,\n"
              "                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT).stdout.decode(errors='replace')\n"
              "    values = {k: v.strip() for k, _, v in (line.partition(':') for line in shown.splitlines())}\n"
              "    if values.get('AT_EUID') in (None, '0') or values.get('AT_SECURE') != '0':\n"
              "        sys.exit(f\"{binary}: euid {values.get('AT_EUID')}, secure {values.get('AT_SECURE')}\")\n")
    outcome = run(source)
    assert outcome.passed, outcome.reason


def test_the_launcher_is_out_of_sight_and_proc_is_read_only():
    """The jail's command line holds nothing (its settings come on stdin), and /proc's knobs
    (oom_score_adj) cannot be written (the program has no /proc at all)."""
    source = ("import sys\n"
              "try:\n"
              "    line = open('/proc/1/cmdline', 'rb').read()\n"
              "except OSError:\n"
              "    line = b''\n"
              "if b'{' in line or b'strict' in line:\n"
              "    sys.exit(f'the launcher shows {line[:80]!r}')\n"
              "try:\n"
              "    open('/proc/self/oom_score_adj', 'w').write('1000')\n"
              "except OSError:\n"
              "    sys.exit(0)\n"
              "sys.exit('oom_score_adj written')\n")
    outcome = run(source)
    assert outcome.passed, outcome.reason


def test_without_libseccomp_strict_mode_refuses_in_one_line(monkeypatch):
    """Where the filter cannot be installed, strict mode stops before the program runs (and
    --weak-sandbox's warning carries this reason, as test_without_isolation... checks)."""
    from mars_cli.evaluation import jail

    monkeypatch.setattr(jail, "seccomp", None)
    with pytest.raises(jail.SetupError, match="cannot install the system-call filter .*libseccomp"):
        jail._filter_system_calls()


# --------------------------------------------------------------------------- the launcher's word
FORGERIES = {  # a program that says what the launcher says when the sandbox cannot be built
    "stderr": ("import sys\n"
               "sys.stderr.write('mars-sandbox: cannot create private namespaces (\\x1b]52;c;ZXZpbA==\\x07FORGERY-7d1e)\\n')\n"
               "sys.exit(125)\n"),
    "every descriptor": ("import os\n"  # the status pipe too, were it still open in the program
                         "line = b'mars-sandbox: cannot create private namespaces (FORGERY-7d1e)\\n'\n"
                         "for fd in range(1, 1024):\n"
                         "    try:\n"
                         "        os.write(fd, line)\n"
                         "    except OSError:\n"
                         "        pass\n"
                         "os._exit(125)\n"),
    "a child's last word": ("import os, sys, time\n"  # a forked child speaks after the program ended
                            "if os.fork() == 0:\n"
                            "    time.sleep(0.2)\n"
                            "    for fd in range(1, 64):\n"
                            "        try:\n"
                            "            os.write(fd, b'mars-sandbox: cannot create private namespaces (FORGERY-7d1e)\\n')\n"
                            "        except OSError:\n"
                            "            pass\n"
                            "    os._exit(125)\n"
                            "time.sleep(0.5)\n"
                            "sys.exit(125)\n"),
}


@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_a_program_cannot_speak_for_the_sandbox(kind):
    """`mars-sandbox: ...` as the last stderr line and exit status 125 (what the launcher once said
    on stderr when it could not build the sandbox) is the program's data: its sample fails, no
    SandboxUnavailable, and its escape sequences are not passed on."""
    outcome = run(FORGERIES[kind])
    assert not outcome.passed
    assert "\x1b" not in outcome.reason and "\x07" not in outcome.reason, outcome.reason


def test_a_forged_refusal_fails_its_sample_and_the_eval_goes_on(tmp_path, capsys, monkeypatch, tiny_dir):
    """Through `mars eval`: every generated program forges the launcher's refusal; the run ends
    with exit 0, results.json and every sample written, each sample's test failed, and nothing of
    the program's bytes on the terminal."""
    real = execution.run_program
    monkeypatch.setattr(execution, "check_function",
                        lambda code, test, timeout=10.0, strict=True: real(FORGERIES["stderr"], timeout, strict))
    out = tmp_path / "run"
    args = ["eval", "--suite", "code", "--limit", "2", "-n", "4", "--methods", "vanilla", "--target", str(tiny_dir),
            "--device", "cpu", "--allow-code-execution", "--out", str(out), *([] if ISOLATED else ["--weak-sandbox"])]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "FORGERY-7d1e" not in captured.err + captured.out and "\x1b" not in captured.err + captured.out
    assert (out / "results.json").is_file()
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]
    assert len(records) == 2 and all(record["task_score"] == 0.0 for record in records), records


# --------------------------------------------------------------------------- memory held in total
def test_memory_outside_the_address_space_limit_is_refused():
    """What RLIMIT_AS does not count is refused: a memfd filled by write() (never mapped), System V
    shared memory (attached, filled, detached), semaphore sets, message queues, POSIX message
    queues, inotify; and the open-file limit is small (pipes and sockets hold kernel memory per
    descriptor)."""
    numbers = {name: system_call(name) for name in ("shmget", "semget", "msgget", "mq_open")}
    source = ("import ctypes, errno, os, sys\n"
              "libc = ctypes.CDLL(None, use_errno=True)\n"
              "held = []\n"
              "memfds = []\n"
              "try:\n"
              "    for _ in range(100):  # 1 MiB each: the file-size limit\n"
              "        memfds.append(os.memfd_create('hold'))\n"
              "        os.write(memfds[-1], b'x' * (1 << 20))\n"
              "except OSError:\n"
              "    pass\n"
              "if memfds:\n"
              "    held.append(f'{len(memfds)} memfds')\n"
              f"segment = libc.syscall({numbers['shmget']}, 0, 16 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT\n"
              "if segment >= 0:\n"
              "    held.append(f'shm {segment}')\n"
              f"if libc.syscall({numbers['semget']}, 0, 1000, 0o1600) >= 0:\n"
              "    held.append('semaphores')\n"
              f"if libc.syscall({numbers['msgget']}, 0, 0o1600) >= 0:\n"
              "    held.append('message queue')\n"
              f"if libc.syscall({numbers['mq_open']}, b'mars-hold', os.O_CREAT | os.O_RDWR, 0o600, None) >= 0:\n"
              "    held.append('POSIX message queue')\n"
              "if libc.inotify_init1(0) >= 0:\n"
              "    held.append('inotify')\n"
              "pipes = 0\n"
              "try:\n"
              "    for _ in range(1000):\n"
              "        os.pipe()\n"
              "        pipes += 1\n"
              "except OSError:\n"
              "    pass\n"
              f"if pipes * 2 > {execution.OPEN_FILES}:\n"
              "    held.append(f'{pipes} pipes')\n"
              "sys.exit(', '.join(held) if held else 0)\n")
    outcome = run(source)
    assert outcome.passed, outcome.reason


HOLDER = """
import os, select, sys, time
chunk, children = {chunk}, {children}
said, say = os.pipe()
kids = []
for _ in range(children):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        try:
            data = b'x' * chunk  # written: resident
        except MemoryError:
            os._exit(3)
        os.write(say, b'1')
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
    if select.select([said], [], [], 5)[0]:  # held, or killed (a write end stays with us)
        os.read(said, 1)
time.sleep(0.5)
alive = [pid for pid in kids if os.waitpid(pid, os.WNOHANG) == (0, 0)]
sys.exit(f'held {{len(alive) * chunk >> 20}} MiB in {{len(alive)}} of {{len(kids)}} children')
"""


def test_the_programs_processes_hold_no_more_than_the_cap_together(monkeypatch):
    """Where a cgroup holds (v2 where delegated, v1 where writable), six children of 96 MiB each
    (each well within its own address-space limit) hold no more than the cap together: the kernel
    kills what goes past it. Run with a 256 MiB cap to keep the test light."""
    if ISOLATED and execution.memory_cap() == "rlimits":
        pytest.skip("no writable cgroup here: the cap is RLIMIT_AS per process (docs/errors.md)")
    monkeypatch.setattr(execution, "MEMORY_LIMIT_BYTES", 256 << 20)
    outcome = run(HOLDER.format(chunk=96 << 20, children=6), timeout=30)
    assert outcome.reason.startswith("held "), outcome.reason
    assert int(outcome.reason.split()[1]) <= 256, outcome.reason


# --------------------------------------------------------------------------- what the program can see
def host_secrets() -> list[str]:
    """Strings of the host the program has no business seeing: the source of every mount (the
    disks: /dev/vda1, an overlay's name) and this process's own cgroup paths."""
    secrets = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        source = line.partition(" - ")[2].split()[1:2]
        if source and source[0].startswith("/dev/"):
            secrets.add(source[0])
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        path = line.split(":", 2)[2]
        if path.strip("/"):
            secrets.add(path)
    return sorted(secrets)


def test_the_program_sees_no_mount_table_no_cgroup_and_no_local_files():
    """No mount table naming the host's disks and the binds' host paths, no host cgroup path, and
    nothing of /usr/local but the interpreter's own files where it lives there (/usr/local/etc and
    /usr/local/bin hold site settings and programs). sysinfo() stays the host's (docs/errors.md)."""
    secrets = host_secrets()
    source = ("import os, sys\n"
              "found = []\n"
              "for path in ('/proc/self/mountinfo', '/proc/self/mounts', '/proc/self/mountstats', '/proc/1/mountinfo',\n"
              "             '/proc/self/cgroup', '/proc/1/cgroup', '/etc/mtab', '/sys/fs/cgroup/cgroup.procs'):\n"
              "    try:\n"
              "        text = open(path).read()\n"
              "    except OSError:\n"
              "        continue\n"
              f"    found += [f'{{path}} names {{secret}}' for secret in {secrets!r} if secret in text]\n"
              "    found += [f'{path} is readable'] if 'mountinfo' in path or 'mounts' in path else []\n"
              "stdlib = os.path.dirname(os.__file__)\n"
              "for folder, _, files in os.walk('/usr/local'):  # the interpreter's own files only\n"
              "    found += [os.path.join(folder, name) for name in files\n"
              "              if os.path.join(folder, name) != os.path.realpath(sys.executable)\n"
              "              and not name.startswith('libpython') and not (folder + '/').startswith(stdlib + '/')]\n"
              "found += [path for path in ('/usr/local/etc', '/usr/local/sbin', '/usr/local/share') if os.path.exists(path)]\n"
              "sys.exit('; '.join(found)[:190] if found else 0)\n")
    outcome = run(source)
    assert outcome.passed, outcome.reason
