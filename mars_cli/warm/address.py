"""Where the warm server of this environment listens, and whether its code is this code.

One server per user, interpreter, package and environment: the socket's name is a digest of
those, so a client under another `MARS_CACHE`, virtual environment or thread setting never talks
to a server set up differently. The folder is the user's own (0700, checked); the socket is 0600.
Light to import: the client runs this before anything heavy.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

PROTOCOL = 1  # bump when the request or event format changes
IDLE_TIMEOUT_S = 900.0  # a server with no request for this long exits
# environment variables that change what a server would load or how it runs
ENV_PREFIXES = ("MARS_", "HF_", "TRANSFORMERS_", "TORCH", "OMP_", "MKL_", "KMP_", "CUDA_", "LLAMA", "GGML",
                "TOKENIZERS_", "PYTORCH_")
# of XDG_*, only the folders things are read from (XDG_SESSION_ID, XDG_VTNR, XDG_SEAT, ... name the
# login, not what is loaded: with them every login started a server of its own)
ENV_NAMES = ("HOME", "PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
             "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_DATA_DIRS", "XDG_CONFIG_DIRS", "XDG_RUNTIME_DIR")
NOT_IDENTITY = ("MARS_SERVER", "MARS_SERVER_IDLE_S")  # how the client uses a server, not what it serves
PACKAGE = Path(__file__).resolve().parent.parent  # mars_cli/
MAX_SOCKET_PATH = 107  # bytes of an AF_UNIX path (sun_path less its terminating NUL)


@dataclass(frozen=True)
class Address:
    folder: Path
    key: str  # the digest of this environment

    @property
    def socket(self) -> Path:
        return self.folder / f"{self.key}.sock"

    @property
    def lock(self) -> Path:
        """Held (flock) by the live server: a socket file without it is stale."""
        return self.folder / f"{self.key}.lock"

    @property
    def log(self) -> Path:
        return self.folder / f"{self.key}.log"


def environment_key() -> str:
    """A digest of everything a server's behaviour depends on besides its code."""
    chosen = {name: value for name, value in os.environ.items()
              if (name.startswith(ENV_PREFIXES) or name in ENV_NAMES) and name not in NOT_IDENTITY}
    identity = {"uid": os.getuid(), "python": sys.executable, "package": str(PACKAGE), "env": sorted(chosen.items()),
                "protocol": PROTOCOL}
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]


def code_stamp() -> str:
    """Every file of the package (code, shipped profiles and heads, kernel sources, data) by name,
    size and modification time: a server started before any of them changed (an upgrade, an edit)
    is not this code's server. Compiled bytecode is left out: it follows the sources."""
    digest = hashlib.sha256()
    for root, folders, files in os.walk(PACKAGE):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(root, name)
            try:
                info = os.stat(path)
            except OSError:  # removed while walking (an editor's temporary file)
                continue
            digest.update(f"{path}:{info.st_size}:{info.st_mtime_ns}:{info.st_ino};".encode())
    return digest.hexdigest()[:16]


def folder() -> Path:
    """$XDG_RUNTIME_DIR/mars-cli, else <tmp>/mars-cli-<uid>: short enough for a socket path."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "mars-cli" if runtime and Path(runtime).is_dir() else \
        Path(tempfile.gettempdir()) / f"mars-cli-{os.getuid()}"
    return base.absolute()  # the server leaves the folder it was started in


def private_folder(path: Path, create: bool) -> bool:
    """Whether `path` is a directory only this user can enter (creating it 0700 if asked): a
    folder another user made or opened up is never used."""
    if create:
        try:
            path.mkdir(mode=0o700, parents=False, exist_ok=True)
        except OSError:
            return False
    return folder_problem(path) is None and path.is_dir()


def folder_problem(path: Path) -> str | None:
    """Why `path` cannot hold this user's warm server, in a phrase; None where it can or does not
    exist yet (no server has run)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != os.getuid():
        return f"belongs to another user (uid {info.st_uid})"
    if stat.S_IMODE(info.st_mode) & 0o077:
        return f"is open to other users (mode {stat.S_IMODE(info.st_mode):04o}; chmod 700 makes it usable again)"
    return None


def owned_folder(path: Path) -> bool:
    """Whether `path` is a folder of this user's, private or not (`--stop` still finds a server there)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def socket_problem(path: Path) -> str | None:
    """Why no server can listen at `path`, in a phrase: too long for AF_UNIX, or something else is
    there (a stale socket is not a problem: the server replaces it)."""
    size = len(os.fsencode(str(path)))
    if size > MAX_SOCKET_PATH:
        return (f"its socket path {path} is {size} bytes, over the {MAX_SOCKET_PATH} a Unix socket allows "
                "(point XDG_RUNTIME_DIR or TMPDIR at a shorter folder)")
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a file that is not a socket"
        return f"{path} is {kind}, where its socket belongs (remove it)"
    return None


def here(create: bool = False) -> Address | None:
    """This environment's address, or None where no private folder can be had."""
    place = folder()
    if not private_folder(place, create):
        return None
    return Address(place, environment_key())


def mode() -> str:
    """MARS_SERVER: `auto` (use a running server, start one after a cold run; the default, except
    under CI), `on` (use one, never start one), or `off` (decode in this process only)."""
    value = os.environ.get("MARS_SERVER", "").strip().lower()
    if value in ("auto", "on", "off"):
        return value
    return "off" if os.environ.get("CI") else "auto"


def idle_timeout_s() -> float:
    """MARS_SERVER_IDLE_S, else IDLE_TIMEOUT_S; a value that is not a positive finite number is ignored."""
    try:
        value = float(os.environ.get("MARS_SERVER_IDLE_S", ""))
    except ValueError:
        return IDLE_TIMEOUT_S
    return value if 0 < value < 7 * 86400 else IDLE_TIMEOUT_S
