"""This project's own CPU kernels (quantized_linear.cpp: the q4 and q4a8 products; layer_ops.cpp:
the lean forward's norms, attention and gating), built once per source and torch version
with torch's extension builder into `$MARS_KERNELS` (default `<cache>/kernels`), then loaded as a
library: `make setup` builds it, a first `--dtype q4` builds it if it is missing.

The library file is only ever whole: a build links in a temporary folder beside it and the result
is renamed into place (fsynced first), under an exclusive lock; loading takes the same lock shared,
so no process maps a file being written. Before it is loaded the file is checked (an ELF shared
object of this machine, as long as its headers say, naming every op): a truncated library (a build
killed while linking, by an older version) would otherwise be mapped and kill the process with
SIGBUS. After loading, every op the code calls (OPS) must exist. A bad file is deleted and rebuilt
once (`problem`); `built`, which `--dtype auto` asks, never builds and says False for it.

`problem()` says in one line why the kernels are not usable (no AVX2, no compiler, a failed
build, a bad file that could not be rebuilt): then `--dtype q4` falls back to torch's own int4
kernel where it has one (with a note), `--dtype q4a8` is an error and `--dtype auto` leaves both
out.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import sys
import uuid
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import torch

from ...paths import cache_dir

SOURCES = [Path(__file__).with_name(name) for name in ("quantized_linear.cpp", "layer_ops.cpp")]
HEADERS = [Path(__file__).with_name(name) for name in ("simd.h", "ops.h", "tiles.h")]
NAME = "mars_quantized_linear"
FLAGS = ["-O3", "-mavx2", "-mfma", "-std=c++17", "-fopenmp"]  # OpenMP: at::parallel_for's threads
OPS = ("quantized_linear", "quantized_linear_a8", "rms_norm", "decoder_layer", "kernel_path")  # what the code calls (torch.ops.mars)
MISSING = "not built yet"  # existing_problem() where there is no library file
LOCK = "build.lock"
TEMPORARY = ".building-"  # a build's own folder inside build_dir(), removed after it
ELF_HEADER = 64  # an ELF64 file header's bytes
ELF_X86_64 = 62
PT_LOAD = 1
SHT_NOBITS = 8


@lru_cache(maxsize=1)
def stamp() -> str:
    """The kernels' build identity: their source text, flags and torch version (a changed source is
    built anew; measurements are keyed by `version()` instead)."""
    text = b"".join(source.read_bytes() for source in SOURCES + HEADERS) + " ".join(FLAGS).encode()
    return hashlib.sha256(text + torch.__version__.encode()).hexdigest()[:16]


# The kernels' numbers and speed, as measurements of them know them: bump it with any change to a
# kernel's arithmetic (tests/decoding/test_kernel_version.py fails when the outputs change and this
# does not) or to its speed (by hand: a faster kernel deserves its cost curves measured anew). A
# change of text alone (a comment, a refactor) keeps every measured choice.
VERSION = 2


def version() -> str:
    """What measured choices on the quantized modes (dtype entries, cost curves) are keyed by: the
    kernels' version, the instruction set they run on, their flags and the torch they run in;
    never their source text (every refactor once threw away a machine's `mars tune`)."""
    return f"{VERSION}:{path() or ''}:{' '.join(FLAGS)}:{torch.__version__}"  # the path: AVX2 and VNNI differ in speed


def path() -> str | None:
    """The instruction set the loaded kernels' q4a8 products run on here ("avx512-vnni", "avx2",
    with why not VNNI where the CPU has it), chosen once per process at run time; None when
    they are not loaded. `mars tune` and `--stats` name it beside their figures."""
    return str(torch.ops.mars.kernel_path()) if loaded() else None


def build_dir() -> Path:
    """One folder per source text, flags and torch version: a changed kernel or torch builds anew."""
    base = Path(os.environ["MARS_KERNELS"]).expanduser() if os.environ.get("MARS_KERNELS") else cache_dir() / "kernels"
    return base / f"{NAME}-{stamp()}"


def library() -> Path:
    """Where the built library is (whole, or not at all)."""
    return build_dir() / f"{NAME}.so"


def cpu_problem() -> str | None:
    """Why this CPU cannot run the kernel, or None."""
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "AMD64"):
        return "the q4 kernel is built for x86-64 Linux"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "the q4 kernel needs AVX2 and FMA"
    return None


def loaded() -> bool:
    """Whether every op the code calls is registered in this process."""
    return all(hasattr(torch.ops.mars, op) for op in OPS)


def built() -> bool:
    """Whether the kernel is usable here without building it now (loaded if it is): what `--dtype
    auto` asks, which must not spend a minute building."""
    return cpu_problem() is None and (loaded() or existing_problem() is None)


def damage() -> str | None:
    """Why the library file that is there cannot be used (None: usable, absent, or this CPU cannot
    run it anyway): what `--dtype auto` says when it leaves the quantized modes out."""
    if cpu_problem() is not None or loaded():
        return None
    why = existing_problem()
    return None if why == MISSING else why


def existing_problem() -> str | None:
    """Why the library already in build_dir() is not usable (MISSING where there is none), or None
    once it is loaded: checked and loaded under the shared lock, never built."""
    return _existing()[0]


@lru_cache(maxsize=1)
def _existing() -> tuple[str | None, tuple[int, int] | None]:
    """existing_problem(), and which file it judged (device, inode): a rebuild deletes that one only."""
    path = library()
    if not path.is_file():
        return MISSING, None
    with _locked(path.parent, exclusive=False):
        judged = _identity(path)
        return file_problem(path) or _load(path), judged


@lru_cache(maxsize=1)
def problem() -> str | None:
    """Why the kernels are not usable here (built now if missing, rebuilt once if the file is bad),
    or None once they are loaded."""
    why = cpu_problem()
    if why is not None:
        return why
    if loaded():
        return None
    bad = existing_problem()
    if bad is None:
        return None
    try:
        failed = _rebuild(_existing()[1])
    except (Exception, SystemExit) as exc:  # torch's builder: no compiler, a failed compile, an unwritable folder
        failed = _last_line(exc)
    if failed is None:
        return None
    if bad == MISSING:
        return f"the q4 kernel could not be built here ({failed})"
    return f"{bad}; it could not be rebuilt ({failed})"


def file_problem(path: Path) -> str | None:
    """Why `path` must not be loaded (read, never mapped: a truncated file mapped kills with
    SIGBUS), or None: an x86-64 ELF shared object, as long as its headers say, naming every op."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        return f"the kernel library {path} cannot be read ({exc.strerror or exc})"
    why = _elf_problem(data)
    if why is not None:
        return f"the kernel library {path} is {why}"
    missing = [op for op in OPS if f"{op}(".encode() not in data]
    if missing:
        return f"{path} is not this project's kernel library (it defines no mars::{missing[0]})"
    return None


def _elf_problem(data: bytes) -> str | None:
    """What is wrong with `data` as an x86-64 ELF64 shared object: too short for what its program
    headers map or its section headers describe, or not one at all; None if nothing is."""
    if len(data) < ELF_HEADER or data[:4] != b"\x7fELF":
        return "not an ELF file" if len(data) >= ELF_HEADER else f"truncated ({len(data)} bytes)"
    if data[4] != 2 or data[5] != 1:  # ELFCLASS64, little-endian
        return "not a 64-bit little-endian ELF file"
    kind, machine = struct.unpack_from("<HH", data, 16)
    if kind != 3 or machine != ELF_X86_64:  # ET_DYN
        return "not an x86-64 shared library"
    phoff, shoff = struct.unpack_from("<QQ", data, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 54)
    needed = max(phoff + phnum * phentsize, shoff + shnum * shentsize)
    if needed <= len(data):
        needed = max([needed] + _extents(data, phoff, phnum, phentsize, shoff, shnum, shentsize))
    if needed > len(data):
        return f"truncated ({len(data)} of at least {needed} bytes: a build cut short?)"
    return None


def _extents(data: bytes, phoff: int, phnum: int, phentsize: int, shoff: int, shnum: int,
             shentsize: int) -> list[int]:
    """Where each loaded segment and each section with file contents ends."""
    ends = []
    for index in range(phnum):
        kind, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", data, phoff + index * phentsize)
        if kind == PT_LOAD:
            ends.append(offset + size)
    for index in range(shnum):
        _, kind, _, _, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + index * shentsize)
        if kind != SHT_NOBITS:
            ends.append(offset + size)
    return ends


def _load(path: Path) -> str | None:
    """Load `path` (checked) and require every op: why it cannot be used, or None."""
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError, ImportError) as exc:
        return f"the kernel library {path} could not be loaded ({_last_line(exc)})"
    missing = [op for op in OPS if not hasattr(torch.ops.mars, op)]
    if missing:
        return f"{path} is not this project's kernel library (it defines no mars::{missing[0]})"
    return None


def _rebuild(bad: tuple[int, int] | None) -> str | None:
    """Under the exclusive lock: the library another process built meanwhile, else a fresh build
    (`bad`: the file judged bad, which is deleted first). Why it failed, or None (loaded)."""
    path = library()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.parent, exclusive=True):
        current = _identity(path)
        if current is not None and current != bad and file_problem(path) is None:  # built by another meanwhile
            return _load(path)
        if current is not None:
            path.unlink()
        build()
    missing = [op for op in OPS if not hasattr(torch.ops.mars, op)]
    return f"the library built lacks mars::{missing[0]}" if missing else None


def build() -> Path:
    """Compile the kernels into a temporary folder inside build_dir() (about a minute on 2 cores),
    which loads them, then rename the library into place, whole. The caller holds the exclusive
    lock. Returns the library."""
    from torch.utils.cpp_extension import load

    path = library()
    for leftover in path.parent.glob(f"{TEMPORARY}*"):  # of a build that was killed
        shutil.rmtree(leftover, ignore_errors=True)
    folder = path.parent / f"{TEMPORARY}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    try:
        load(name=NAME, sources=[str(source) for source in SOURCES], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
             build_directory=str(folder), is_python_module=False, verbose=False)
        made = next(folder.glob(f"{NAME}*.so"))  # NAME_v1.so for a second build in one process
        _sync(made)
        os.replace(made, path)
        _sync(path.parent)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return path


def _sync(path: Path) -> None:
    """Flush `path` (a file, or a folder's entries) to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file `path` is now (device, inode), or None where there is none."""
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_dev, found.st_ino


@contextmanager
def _locked(folder: Path, exclusive: bool) -> Iterator[None]:
    """`folder`'s build lock, exclusive (building) or shared (loading). A folder that cannot hold a
    lock file (read-only) is loaded from unlocked: nobody can build there either."""
    import fcntl

    try:
        descriptor: int | None = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        if exclusive:
            raise
        descriptor = None
    try:
        if descriptor is not None:
            fcntl.flock(descriptor, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        if descriptor is not None:
            os.close(descriptor)


def _last_line(error: BaseException) -> str:
    """An error's last line (a build's log ends with what failed), cut to 160 characters."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return lines[-1][:160]


def main() -> int:
    """`python -m mars_cli.decoding.kernels`: build now (make setup), and say where or why not.
    Exit 0 once loaded, or where this CPU cannot run the kernels (they are optional: `make setup`
    goes on); 1 where they could not be built or loaded here (`make setup` stops)."""
    why = problem()
    if why is None:
        print(f"mars q4 kernel: {library()}")
        return 0
    if cpu_problem() is not None:
        print(f"mars q4 kernel: not used here: {why} (--dtype q4 falls back to torch's int4 kernel; q4a8 needs these)")
        return 0
    print(f"mars q4 kernel: not usable: {why}", file=sys.stderr)
    return 1
