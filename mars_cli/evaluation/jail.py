"""The sandbox's launcher for generated code: a standalone script (standard library only, run as
`python -I -B jail.py CONFIG`) so that nothing of mars is imported where untrusted code will run.

Strict mode builds, before the program starts:
- private mount, PID, network, IPC and UTS namespaces (plus a user namespace when not root);
- a mount view where every mount is read-only except the run's own temporary directory;
- a new /proc for the PID namespace, so the program sees only its own processes;
- the program as an unprivileged user (`nobody` when started as root; a nested user namespace
  otherwise, which locks the read-only mounts), with no_new_privs and resource limits, including
  a process-count limit (RLIMIT_NPROC, which the kernel does not enforce for root).
The launcher's child is PID 1 of the namespace: when the program exits, or when the launcher is
killed (parent-death signal), it exits and the kernel kills every process left in the namespace,
so a forked child can never outlive the run.

If a step fails, strict mode prints one `mars-sandbox: <reason>` line on stderr and exits with
SETUP_FAILED before running anything; weak mode (--weak-sandbox) skips what the system refuses.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import select
import signal
import sys

SETUP_FAILED = 125
NOBODY = 65534

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
               "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
# pseudo file systems whose files the unprivileged program cannot write anyway; a remount that the
# kernel refuses there (locked by an outer container) does not open a hole
_PSEUDO = ("/proc", "/sys", "/dev/pts", "/dev/mqueue")

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """A step of the isolation that this system refuses."""


def _call(name: str, *args: object) -> None:
    if getattr(_libc, name)(*args) != 0:
        code = ctypes.get_errno()
        raise SetupError(f"{name}: {os.strerror(code)} ({errno.errorcode.get(code, code)})")


def _mount(source: str | None, target: str, kind: str | None, flags: int) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    _call("mount", encode(source), encode(target), encode(kind), ctypes.c_ulong(flags), None)


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _mounts() -> list[tuple[str, int]]:
    """(mount point, flags to keep on a remount) for every mount, parents before children."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 for a space, and so on
            kept = sum(_KEPT_FLAGS.get(option, 0) for option in fields[5].split(","))
            found.append((point, kept))
    return found


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _read_only_view(folder: str) -> None:
    """Every mount read-only except `folder` (bound onto itself first, so it stays writable)."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do here propagates to the host
    _mount(folder, folder, None, MS_BIND)
    for point, kept in _mounts():
        if point == folder:
            continue
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
        except SetupError as exc:
            if not _under(point, _PSEUDO) and os.path.exists(point):
                raise SetupError(f"cannot make {point} read-only ({exc})") from None


def _searchable_by_nobody(directory: str) -> bool:
    info = os.stat(directory)
    mode = info.st_mode
    return bool(mode & 0o001 or (info.st_uid == NOBODY and mode & 0o100) or (info.st_gid == NOBODY and mode & 0o010))


def _expose(paths: list[str], folder: str) -> None:
    """Make `paths` reachable by `nobody` in this mount view (root only). An ancestor it may not
    enter (say /root, mode 0700, above a pyenv Python) is covered by an empty read-only tmpfs that
    holds only the entries on the way to `paths`, each bound back from the real tree; whatever
    else that directory holds stays hidden from the program."""
    covered: dict[str, str] = {}  # covered ancestor -> where its real contents stay reachable for us
    for path in paths:
        parts = os.path.realpath(path).strip("/").split("/")
        for depth in range(len(parts)):
            ancestor = "/" + "/".join(parts[:depth])
            entry = os.path.join(ancestor, parts[depth])
            if ancestor not in covered:
                if _searchable_by_nobody(ancestor):
                    continue
                if os.path.realpath(folder).startswith(ancestor.rstrip("/") + "/"):
                    raise SetupError(f"its temporary directory lies under {ancestor}, which nobody may not enter")
                stage = covered[ancestor] = os.path.join(folder, f".stage-{len(covered)}")
                os.mkdir(stage)
                _mount(ancestor, stage, None, MS_BIND | MS_REC)
                _mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV)
                os.chmod(ancestor, 0o755)
            if not os.path.lexists(entry):
                source = os.path.join(covered[ancestor], parts[depth])
                os.mkdir(entry) if os.path.isdir(source) else open(entry, "w").close()
                _mount(source, entry, None, MS_BIND | MS_REC)
                _mount(None, entry, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    for ancestor, stage in covered.items():
        _mount(None, ancestor, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        _call("umount2", stage.encode(), ctypes.c_int(2))  # MNT_DETACH
        os.rmdir(stage)


def _count_processes(uid: int) -> int:
    """Processes (threads included, as RLIMIT_NPROC counts them) whose real uid is `uid`."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        values = dict(line.split(":", 1) for line in lines if ":" in line)
        if int(values.get("Uid", "-1 0").split()[0]) == uid:
            count += int(values.get("Threads", "1").strip() or 1)
    return count


def _limits(config: dict, processes: int) -> None:
    for name, value in (("RLIMIT_AS", config["memory"]), ("RLIMIT_CPU", config["cpu"]),
                        ("RLIMIT_FSIZE", config["fsize"]), ("RLIMIT_CORE", 0), ("RLIMIT_NPROC", processes)):
        resource.setrlimit(getattr(resource, name), (value, value))


def _become_unprivileged(config: dict, as_root: bool, notes: list[str], strict: bool) -> None:
    """Drop to `nobody` (root) or into a nested user namespace (non-root), then set the limits."""
    folder = config["folder"]
    if as_root:
        others = _count_processes(NOBODY)  # RLIMIT_NPROC counts the user's processes system-wide
        try:
            _limits(config, others + config["processes"])
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        except OSError as exc:
            if strict:
                why = "uid 65534 is not mapped in this user namespace" if exc.errno == errno.EINVAL else exc.strerror
                raise SetupError(f"cannot switch to the unprivileged user nobody ({why})") from None
            notes.append("runs as root")
            _limits(config, resource.RLIM_INFINITY)
    else:
        # root that cannot become nobody (main) is nobody inside, never root of its own namespace
        uid, gid = config["uid"] or NOBODY, config["gid"] or NOBODY
        try:
            _call("unshare", ctypes.c_int(CLONE_NEWUSER))  # a user namespace with no power over the mounts
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} 0 1\n")
            _write("/proc/self/gid_map", f"{gid} 0 1\n")
        except (SetupError, OSError) as exc:
            if strict:
                raise SetupError(f"cannot lock the read-only mounts ({exc})") from None
        _limits(config, config["processes"] + (0 if config["namespaces"] else _count_processes(os.getuid())))
    _call("prctl", ctypes.c_int(PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
          ctypes.c_ulong(0))
    for path, mode, use in ((folder, os.W_OK, "write to"), (config["python"], os.X_OK, "run")):
        if not os.access(path, mode):
            raise SetupError(f"the unprivileged user cannot {use} {path}")


def _init(config: dict, alive: int, as_root: bool, strict: bool, notes: list[str]) -> int:
    """PID 1 of the namespace: build the view, start the program, reap, return its status."""
    _call("prctl", ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
          ctypes.c_ulong(0), ctypes.c_ulong(0))
    if select.select([alive], [], [], 0)[0]:  # the launcher died before the signal was armed
        return SETUP_FAILED
    if config["namespaces"]:
        _read_only_view(config["folder"])
        if as_root:  # the unprivileged program must reach the interpreter and its library
            _expose(config["reachable"], config["folder"])
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except SetupError:
            notes.append("host /proc")
    program = os.fork()
    if program == 0:
        try:
            _become_unprivileged(config, as_root, notes, strict)
            os.chdir(config["folder"])
            env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "HOME": config["folder"],
                   "TMPDIR": config["folder"]}
            os.execve(config["python"], [config["python"], "-I", "-B", config["program"]], env)
        except (SetupError, OSError) as exc:
            print(f"mars-sandbox: {exc}", file=sys.stderr, flush=True)
        os._exit(SETUP_FAILED)
    while True:  # as PID 1, orphans are ours to reap too
        pid, status = os.wait()
        if pid == program:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _nobody_mapped() -> bool:
    """Whether uid and gid 65534 exist in this user namespace. Under `unshare --user
    --map-root-user` only root does: chown and setuid to nobody fail there with EINVAL (which once
    became a silent score of 0 for every program)."""
    try:
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/self/{name}") as handle:
                ranges = [tuple(map(int, line.split())) for line in handle if line.strip()]
            if not any(len(r) == 3 and r[0] <= NOBODY < r[0] + r[2] for r in ranges):
                return False
    except (OSError, ValueError):
        return True  # no map to read: the chown below answers for itself
    return True


def main() -> int:
    config = json.loads(sys.argv[1])
    strict = config["strict"]
    # root that cannot become nobody (a user namespace that maps only root) is isolated as any
    # other user is: a user namespace of its own, the program's directory left as it is
    as_root = os.geteuid() == 0 and _nobody_mapped()
    notes: list[str] = []
    config.update(uid=os.getuid(), gid=os.getgid(), namespaces=True)
    if as_root:
        try:
            os.chown(config["folder"], NOBODY, NOBODY)
        except OSError as exc:  # the program could not write its own directory: refuse in both modes
            print(f"mars-sandbox: cannot give the program's directory to the unprivileged user nobody "
                  f"({exc.strerror})", file=sys.stderr)
            return SETUP_FAILED
    try:
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
        _call("unshare", ctypes.c_int(flags | (0 if as_root else CLONE_NEWUSER)))
        if not as_root:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"0 {config['uid']} 1\n")
            _write("/proc/self/gid_map", f"0 {config['gid']} 1\n")
    except (SetupError, OSError) as exc:
        if strict:
            print(f"mars-sandbox: cannot create private namespaces ({exc})", file=sys.stderr)
            return SETUP_FAILED
        config["namespaces"] = False
    alive, keep = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(keep)
        try:
            code = _init(config, alive, as_root, strict, notes)
        except SetupError as exc:
            print(f"mars-sandbox: {exc}", file=sys.stderr, flush=True)
            code = SETUP_FAILED
        os._exit(code)
    os.close(alive)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main())
