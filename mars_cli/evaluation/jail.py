"""The sandbox's launcher for generated code: a standalone script (the standard library and
libseccomp's binding only, run as `python -I -B jail.py` with its configuration on stdin, so that no
command line shows it) so that nothing of mars is imported where untrusted code will run.

Strict mode builds, before the program starts:
- a memory and process cap on everything the run holds: a cgroup of its own (`Cgroup`, made by the
  caller: cgroup v2 `memory.max`, `memory.swap.max` 0 and `pids.max` where the host delegates one,
  else cgroup v1's memory and pids controllers where they are writable), which the launcher joins
  first, so the program and all it forks are charged to it;
- private mount, PID, network, IPC, UTS and cgroup namespaces (plus a user namespace when not
  root); the network namespace also makes the abstract Unix-socket namespace private;
- a root of its own (`_private_root`): an empty tmpfs holding, read-only, only what Python needs
  (the interpreter's binary, standard library and shared library, /usr without /usr/local, the
  /bin, /lib links, the loader's cache, four device nodes) and the program's folder: a small tmpfs
  of its own (`quota` bytes) holding the program. The host's tree is then detached (pivot_root), so
  no host file, directory or socket (/tmp, /run, /dev/shm, the home directories, the project) can
  be named, read or connected to. A /proc serves the set-up and is unmounted before the program
  starts: the program has no /proc (no mount table naming the host's disk and paths, no cgroup
  path, no process of the launcher);
- the program as an unprivileged user (`nobody` when started as root; a nested user namespace
  otherwise, which locks the read-only mounts), with no_new_privs and resource limits, including
  a process-count limit (RLIMIT_NPROC, which the kernel does not enforce for root) and a small
  open-file limit;
- a small kernel surface (`_filter_system_calls`): a fresh session keyring, and a seccomp filter
  (built by libseccomp) that refuses the calls container runtimes refuse by default: keyrings,
  io_uring, userfaultfd, new namespaces, netlink sockets, mounts, tracing, kernel modules and
  clocks; and what holds memory outside the address-space limit: memfd_create, System V shared
  memory, semaphores and message queues, POSIX message queues, inotify.
The launcher's child is PID 1 of the namespace: when the program exits, or when the launcher is
killed (parent-death signal), it exits and the kernel kills every process left in the namespace,
so a forked child can never outlive the run.

The verdict travels on a channel the program cannot write: the status pipe (`config["status"]`,
a descriptor the caller passed), which every launcher process holds close-on-exec and PID 1 closes
before it lets the program start. If a step fails, strict mode writes one `mars-sandbox: <reason>`
line there and exits with SETUP_FAILED before running anything; just before the program's exec
the launcher writes `STARTED`. Whatever the program prints on stdout and stderr, and its exit
status, are its own, never the launcher's word. Weak mode (--weak-sandbox) skips what the system
refuses.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import select
import signal
import sys
import time

try:  # libseccomp's own binding where installed, else the ctypes one of the same interface
    import seccomp
except ImportError:
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, RuntimeError):  # pyseccomp raises when libseccomp is missing
        seccomp = None

SETUP_FAILED = 125
NOBODY = 65534
PREFIX = "mars-sandbox: "  # a line of the launcher's on the status pipe: the sandbox cannot be built
STARTED = "STARTED"  # the status pipe's last word before the program's exec
LAUNCHER_TASKS = 2  # the launcher and PID 1 of the namespace, in the cgroup beside the program

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_NEWCGROUP = 0x02000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """A step of the isolation that this system refuses."""


def _call(name: str, *args: object) -> None:
    if getattr(_libc, name)(*args) != 0:
        code = ctypes.get_errno()
        raise SetupError(f"{name}: {os.strerror(code)} ({errno.errorcode.get(code, code)})")


def report(status: int | None, message: str) -> None:
    """The launcher's word that the sandbox cannot be built: one line on the status pipe, which the
    program never holds (its stdout and stderr are the program's own, read as data). A launcher
    started without a status pipe (by hand, not by execution.py) says it on stderr."""
    if status is None:
        print(f"{PREFIX}{message}", file=sys.stderr, flush=True)
        return
    with contextlib.suppress(OSError):
        os.write(status, f"{PREFIX}{message}\n".encode("utf-8", "replace"))


def _close(status: int | None) -> None:
    if status is not None:
        os.close(status)


def _mount(source: str | None, target: str, kind: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    _call("mount", encode(source), encode(target), encode(kind), ctypes.c_ulong(flags), encode(data))


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


# --------------------------------------------------------------------------- the run's cgroup
def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(type, mount point, root, options) of this process's cgroup and cgroup2 mounts."""
    mounts = []
    for line in _read("/proc/self/mountinfo").splitlines():
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            decode = lambda text: text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")  # noqa: E731
            mounts.append((rest[0], decode(fields[4]), decode(fields[3]), set(rest[2].split(","))))
    return mounts


def _below(path: str, root: str) -> str | None:
    """`path` (from /proc/self/cgroup) relative to a mount's `root`, or None outside it."""
    if root == "/":
        return path
    if path == root or path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")):] or "/"
    return None


class Cgroup:
    """A cgroup of one run's own, made by the caller before the launcher starts and removed after
    it ends: everything the program's processes hold (anonymous memory, memfd and shared memory,
    tmpfs pages, kernel memory) counts against `memory` bytes, with no swap, and all of them and
    the launcher together against `tasks`. `create` takes cgroup v2 where a cgroup of this process's
    (or an ancestor's) has the memory controller for its children and is writable (delegated to the
    user, or root), else cgroup v1's memory (and pids) hierarchy where writable, else None."""

    def __init__(self, mechanism: str, folders: list[str]) -> None:
        self.mechanism = mechanism
        self.folders = folders

    @property
    def procs(self) -> list[str]:
        """The files the launcher writes its pid to, to join."""
        return [os.path.join(folder, "cgroup.procs") for folder in self.folders]

    @classmethod
    def create(cls, memory: int, tasks: int) -> "Cgroup | None":
        try:
            mounts = _cgroup_mounts()
            own = {}
            for line in _read("/proc/self/cgroup").splitlines():
                _, controllers, path = line.split(":", 2)
                for controller in (controllers.split(",") if controllers else [""]):
                    own[controller] = path
        except (OSError, ValueError):
            return None
        name = f"mars-sandbox-{os.getpid()}-{os.urandom(6).hex()}"
        for kind, point, root, _ in mounts:  # cgroup v2: the nearest ancestor that hands memory down
            relative = _below(own.get("", ""), root) if kind == "cgroup2" and "" in own else None
            if relative is None:
                continue
            parts = [part for part in relative.split("/") if part]
            for depth in range(len(parts), -1, -1):
                base = os.path.join(point, *parts[:depth])
                try:
                    enabled = _read(os.path.join(base, "cgroup.subtree_control")).split()
                except OSError:
                    continue
                if "memory" not in enabled:
                    continue
                settings = [("memory.max", memory), ("memory.swap.max", 0)]
                if "pids" in enabled:
                    settings.append(("pids.max", tasks))
                folder = cls._make(os.path.join(base, name), settings)
                if folder is not None:
                    return cls("cgroup v2", [folder])
        folders = []  # cgroup v1: a memory hierarchy (required) and a pids one (where there is)
        for controller, settings in (("memory", [("memory.limit_in_bytes", memory),
                                                 ("memory.memsw.limit_in_bytes", memory)]),
                                     ("pids", [("pids.max", tasks)])):
            for kind, point, root, options in mounts:
                relative = _below(own.get(controller, ""), root) if controller in own else None
                if kind != "cgroup" or controller not in options or relative is None:
                    continue
                folder = cls._make(os.path.join(point, *[p for p in relative.split("/") if p], name), settings)
                if folder is not None:
                    folders.append(folder)
                break
            if not folders:
                return None
        return cls("cgroup v1", folders)

    @staticmethod
    def _make(folder: str, settings: list[tuple[str, int]]) -> str | None:
        """mkdir `folder` and write its limits; None (and nothing left) where any is refused. A
        setting whose file does not exist (no swap accounting) is skipped."""
        try:
            os.mkdir(folder, 0o755)
        except OSError:
            return None
        try:
            for name, value in settings:
                if os.path.exists(os.path.join(folder, name)):
                    _write(os.path.join(folder, name), str(value))
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
            return None
        return folder

    def remove(self, wait: float = 5.0) -> bool:
        """Kill whatever is left in the cgroup and remove it (a dying namespace takes a moment to
        empty); False where it could not be removed within `wait` seconds."""
        removed = True
        for folder in self.folders:
            deadline = time.monotonic() + wait
            while True:
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        removed = False
                        break
                with contextlib.suppress(OSError):
                    if os.path.exists(os.path.join(folder, "cgroup.kill")):
                        _write(os.path.join(folder, "cgroup.kill"), "1")
                    else:  # cgroup v1: its members are the run's processes
                        for pid in _read(os.path.join(folder, "cgroup.procs")).split():
                            with contextlib.suppress(OSError):
                                os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.01)
        return removed


SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache")
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_STAT_TO_MOUNT = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                  (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}  # syscall numbers


def _place(host: str, root: str, writable: bool = False) -> None:
    """Bind `host` (a file, a directory or a symbolic link) at the same path under `root`,
    read-only unless `writable`; a link is recreated as a link (merged /usr: /bin -> usr/bin)."""
    target = root + host
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(host):
        if not os.path.lexists(target):
            os.symlink(os.readlink(host), target)
        return
    if os.path.isdir(host):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        open(target, "w").close()
    _mount(host, target, None, MS_BIND | MS_REC)
    if not writable:
        device = host.startswith("/dev/")
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if device else MS_NODEV)
               | _kept_flags(host))


def _kept_flags(path: str) -> int:
    """The flags of the mount that holds `path`, which a remount must keep (in a user namespace
    the kernel locks them, and refuses a remount that would drop one)."""
    flags = os.statvfs(path).f_flag
    return sum(mount for stat, mount in _STAT_TO_MOUNT if flags & stat)


PROC_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC
LOCAL = "/usr/local"  # site software and its settings (/usr/local/etc, /usr/local/bin): masked


def _mount_proc(target: str) -> None:
    """A fresh /proc for the PID namespace, hiding processes of other users and everything but the
    processes where the kernel knows hidepid and subset. It serves the set-up only (the program's
    own user namespace is mapped through it) and is gone before the program starts (`_drop_proc`)."""
    flags = PROC_FLAGS
    for options in ("hidepid=invisible,subset=pid", "hidepid=2", None):  # subset: no /proc/keys, /proc/sys
        try:
            _mount("proc", target, "proc", flags, options)
            return
        except SetupError as exc:
            problem = exc
    raise SetupError(f"cannot mount a private /proc ({problem})")


def _drop_proc() -> None:
    """Unmount /proc once the program's user namespace is mapped and before it runs: Python needs
    none, and it would show the mount table (the host's disk, the binds' host paths), the host's
    cgroup path, and knobs such as /proc/self/oom_score_adj."""
    _call("umount2", b"/proc", ctypes.c_int(2))  # MNT_DETACH


def _private_root(config: dict) -> None:
    """Make the mount namespace's root an empty tmpfs (`config["stage"]`, an empty host directory,
    is its mount point) that holds only what Python needs, read-only, a /proc for the set-up, and
    the program's folder as a tmpfs of `config["quota"]` bytes with the program copied in; then
    pivot into it and detach the host's tree. /usr/local is an empty tmpfs but for the
    interpreter's own files where they lie there."""
    stage, folder = config["stage"], config["folder"]
    os.umask(0o022)  # the root's directories must be searchable by the unprivileged program
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do here propagates to the host
    _mount("tmpfs", stage, "tmpfs", MS_NOSUID, "mode=0755,size=1m")
    for host in (*SYSTEM, *DEVICES):
        if os.path.lexists(host):
            _place(host, stage)
    local = stage + LOCAL
    masked = os.path.isdir(local) and not os.path.islink(local)
    if masked:
        _mount("tmpfs", local, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
    shown = [host for host in SYSTEM if os.path.isdir(host) and not os.path.islink(host)]
    for host in config["interpreter"]:
        inside = any(host == top or host.startswith(top + "/") for top in shown)
        if os.path.lexists(host) and (not inside or host == LOCAL or host.startswith(LOCAL + "/")):
            _place(host, stage)
    if masked:
        _mount(None, local, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
    os.makedirs(stage + folder)
    owner = f",uid={NOBODY},gid={NOBODY}" if os.geteuid() == 0 and config["as_root"] else ""  # root runs it as nobody
    _mount("tmpfs", stage + folder, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0755,size={config['quota']}{owner}")
    with open(config["program"], "rb") as source, open(stage + config["program"], "wb") as copy:
        copy.write(source.read())
    os.chmod(stage + config["program"], 0o644)
    os.makedirs(stage + "/proc")
    _mount_proc(stage + "/proc")
    _mount(None, stage, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID, "mode=0755,size=1m")
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise SetupError(f"pivot_root is not known on {os.uname().machine}")
    os.chdir(stage)
    if _libc.syscall(ctypes.c_long(number), b".", b".") != 0:  # the old root ends up on top of the new one
        raise SetupError(f"pivot_root: {os.strerror(ctypes.get_errno())}")
    _call("umount2", b".", ctypes.c_int(2))  # MNT_DETACH: the host's tree leaves this namespace
    os.chdir("/")


# System calls the program is refused (EPERM): what container runtimes' default seccomp profiles
# refuse, and what this sandbox was seen to let through (keyrings shared between runs, io_uring,
# userfaultfd, unshare of a user namespace).
REFUSED_CALLS = (
    "add_key", "request_key", "keyctl",  # keyrings outlive a run and share a quota
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    "bpf", "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "syslog", "vhangup", "open_by_handle_at", "name_to_handle_at",
    "fanotify_init", "lookup_dcookie", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "personality", "mbind", "set_mempolicy", "move_pages",
    # memory that RLIMIT_AS does not count: a memfd written to (never mapped), System V shared
    # memory attached, filled and detached, semaphore sets and message queues, POSIX message
    # queues, inotify watches (kernel memory per watch)
    "memfd_create", "memfd_secret", "shmget", "shmat", "semget", "msgget", "mq_open",
    "inotify_init", "inotify_init1", "inotify_add_watch",
)
NEW_NAMESPACES = 0x00000080 | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID \
    | CLONE_NEWNET | 0x02000000  # CLONE_NEWTIME, CLONE_NEWCGROUP
AF_NETLINK = 16
KEYCTL_JOIN_SESSION_KEYRING = 1


def _filter_system_calls() -> None:
    """Join a fresh, empty session keyring, then install the seccomp filter (no_new_privs is set
    already) that refuses REFUSED_CALLS, clone with a new-namespace flag, netlink sockets, and
    clone3 (ENOSYS: its flags lie in memory a filter cannot read, so the C library falls back to
    clone). Inherited by everything the program runs or forks; it cannot be lifted."""
    if seccomp is None:
        raise SetupError("cannot install the system-call filter (libseccomp not found: install the libseccomp2 "
                         "package)")
    arch = seccomp.system_arch()
    keyctl = seccomp.resolve_syscall(arch, "keyctl")
    if _libc.syscall(ctypes.c_long(keyctl), ctypes.c_int(KEYCTL_JOIN_SESSION_KEYRING), None) < 0 and \
            ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM, errno.EACCES):  # no keyrings at all: nothing to leave
        raise SetupError(f"cannot give the program a session keyring of its own ({os.strerror(ctypes.get_errno())})")
    refuse = seccomp.ERRNO(errno.EPERM)
    try:
        rules = seccomp.SyscallFilter(seccomp.ALLOW)
        for name in REFUSED_CALLS:
            try:
                rules.add_rule(refuse, name)
            except (OSError, ValueError, RuntimeError):
                continue  # not a system call on this architecture
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        for flag in (1 << bit for bit in range(32) if NEW_NAMESPACES & (1 << bit)):
            rules.add_rule(refuse, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.EQ, AF_NETLINK))
        rules.load()
    except (OSError, ValueError, RuntimeError) as exc:
        raise SetupError(f"cannot install the system-call filter ({exc})") from None


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
                        ("RLIMIT_FSIZE", config["fsize"]), ("RLIMIT_CORE", 0), ("RLIMIT_NPROC", processes),
                        ("RLIMIT_NOFILE", config["files"])):
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
    try:
        _filter_system_calls()
    except SetupError:
        if strict:
            raise
        notes.append("no system-call filter")  # weak mode: sandbox_mode's warning named the reason
    for path, mode, use in ((folder, os.W_OK, "write to"), (config["python"], os.X_OK, "run")):
        if not os.access(path, mode):
            raise SetupError(f"the unprivileged user cannot {use} {path}")


def _init(config: dict, alive: int, as_root: bool, strict: bool, notes: list[str], status: int | None) -> int:
    """PID 1 of the namespace: build the view, start the program, reap, return its status. It
    closes the status pipe before it lets the program's process go on to its exec, so that no
    process the program could reach holds the launcher's channel."""
    _call("prctl", ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
          ctypes.c_ulong(0), ctypes.c_ulong(0))
    if select.select([alive], [], [], 0)[0]:  # the launcher died before the signal was armed
        return SETUP_FAILED
    private_root = False
    if config["namespaces"]:
        try:
            _private_root(config)
            private_root = True
        except (SetupError, OSError) as exc:
            if strict:
                raise SetupError(f"cannot build the program's own root ({exc})") from None
            notes.append("host file system")
    ready, set_up = os.pipe()  # the program's process says its user namespace is mapped
    go, started = os.pipe()  # PID 1 says /proc is gone and the status pipe closed
    program = os.fork()
    if program == 0:
        try:
            os.close(ready)
            os.close(started)
            _become_unprivileged(config, as_root, notes, strict)
            os.write(set_up, b"1")
            if os.read(go, 1) != b"1":  # PID 1 said why on the status pipe
                os._exit(SETUP_FAILED)
            os.chdir(config["folder"])
            env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "HOME": config["folder"],
                   "TMPDIR": config["folder"]}
            if status is not None:
                os.write(status, f"{STARTED}\n".encode())  # close-on-exec: the exec closes it
            os.execve(config["python"], [config["python"], "-I", "-B", config["program"]], env)
        except (SetupError, OSError) as exc:
            report(status, str(exc))
        os._exit(SETUP_FAILED)
    os.close(set_up)
    os.close(go)
    proceed = os.read(ready, 1) == b"1"  # nothing: the program's set-up failed and said why
    if proceed and private_root:
        try:
            _drop_proc()
        except SetupError as exc:
            if strict:
                report(status, f"cannot unmount the set-up's /proc ({exc})")
                proceed = False
    _close(status)
    if proceed:
        os.write(started, b"1")
    os.close(started)
    while True:  # as PID 1, orphans are ours to reap too
        pid, code = os.wait()
        if pid == program:
            return os.waitstatus_to_exitcode(code) if os.WIFEXITED(code) else 128 + os.WTERMSIG(code)


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
    config = json.loads(sys.stdin.read())  # not argv: /proc/1/cmdline would show it to the program
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the program gets no stdin
    status = config.get("status")  # execution.py always passes one
    if status is not None:
        os.set_inheritable(status, False)  # close-on-exec in every launcher process
    strict = config["strict"]
    # root that cannot become nobody (a user namespace that maps only root) is isolated as any
    # other user is: a user namespace of its own, the program's directory left as it is
    as_root = os.geteuid() == 0 and _nobody_mapped()
    notes: list[str] = []
    config.update(uid=os.getuid(), gid=os.getgid(), namespaces=True, as_root=as_root)
    for procs in config.get("cgroup") or []:  # first: all that follows is charged to the run's cgroup
        try:
            _write(procs, str(os.getpid()))
        except OSError as exc:
            if strict:
                report(status, f"cannot join the run's cgroup {os.path.dirname(procs)} ({exc.strerror})")
                return SETUP_FAILED
            notes.append("no cgroup")
    if as_root:
        try:
            os.chown(config["folder"], NOBODY, NOBODY)
        except OSError as exc:  # the program could not write its own directory: refuse in both modes
            report(status, f"cannot give the program's directory to the unprivileged user nobody ({exc.strerror})")
            return SETUP_FAILED
    try:
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
        flags |= 0 if as_root else CLONE_NEWUSER
        try:  # a cgroup namespace too where the kernel has them: the program's cgroup is its root
            _call("unshare", ctypes.c_int(flags | CLONE_NEWCGROUP))
        except SetupError:
            _call("unshare", ctypes.c_int(flags))
        if not as_root:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"0 {config['uid']} 1\n")
            _write("/proc/self/gid_map", f"0 {config['gid']} 1\n")
    except (SetupError, OSError) as exc:
        if strict:
            report(status, f"cannot create private namespaces ({exc})")
            return SETUP_FAILED
        config["namespaces"] = False
    alive, keep = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(keep)
        try:
            code = _init(config, alive, as_root, strict, notes, status)
        except SetupError as exc:
            report(status, str(exc))
            code = SETUP_FAILED
        os._exit(code)
    os.close(alive)
    _close(status)
    _, code = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(code) if os.WIFEXITED(code) else 128 + os.WTERMSIG(code)


if __name__ == "__main__":
    sys.exit(main())
