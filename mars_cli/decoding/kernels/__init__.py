"""This project's own CPU kernels (quantized_linear.cpp: the q4 and q4a8 products; layer_ops.cpp:
the lean forward's norms, attention and gating), built once per source and torch version
with torch's extension builder into `$MARS_KERNELS` (default `<cache>/kernels`), then loaded as a
library: `make setup` builds it, a first `--dtype q4` builds it if it is missing.

`load()` returns whether `torch.ops.mars.quantized_linear` is usable; `problem()` says why not in
one line (no AVX2, no compiler, a failed build): then `--dtype q4` falls back to torch's own int4
kernel where it has one.
"""

from __future__ import annotations

import hashlib
import os
import sys
from functools import lru_cache
from pathlib import Path

import torch

from ...paths import cache_dir

SOURCES = [Path(__file__).with_name(name) for name in ("quantized_linear.cpp", "layer_ops.cpp")]
HEADERS = [Path(__file__).with_name(name) for name in ("simd.h", "ops.h")]
NAME = "mars_quantized_linear"
FLAGS = ["-O3", "-mavx2", "-mfma", "-std=c++17", "-fopenmp"]  # OpenMP: at::parallel_for's threads


@lru_cache(maxsize=1)
def stamp() -> str:
    """The kernels' identity: their source text, flags and torch version. Measurements of forwards
    on them (cost curves, `--dtype auto`) are keyed by it, so a changed kernel is measured anew."""
    text = b"".join(source.read_bytes() for source in SOURCES + HEADERS) + " ".join(FLAGS).encode()
    return hashlib.sha256(text + torch.__version__.encode()).hexdigest()[:16]


def build_dir() -> Path:
    """One folder per source text, flags and torch version: a changed kernel or torch builds anew."""
    base = Path(os.environ["MARS_KERNELS"]).expanduser() if os.environ.get("MARS_KERNELS") else cache_dir() / "kernels"
    return base / f"{NAME}-{stamp()}"


def cpu_problem() -> str | None:
    """Why this CPU cannot run the kernel, or None."""
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "AMD64"):
        return "the q4 kernel is built for x86-64 Linux"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "the q4 kernel needs AVX2 and FMA"
    return None


def built() -> bool:
    """Whether the kernel is usable here without building it now (loaded if it is)."""
    if cpu_problem() is not None:
        return False
    if hasattr(torch.ops.mars, "quantized_linear"):
        return True
    return (build_dir() / f"{NAME}.so").is_file() and problem() is None


@lru_cache(maxsize=1)
def problem() -> str | None:
    """Why the kernels are not usable here (built now if missing), or None once they are loaded."""
    why = cpu_problem()
    if why is not None:
        return why
    if hasattr(torch.ops.mars, "quantized_linear"):
        return None
    library = build_dir() / f"{NAME}.so"
    try:
        if library.is_file():
            torch.ops.load_library(str(library))
        else:
            build()  # which loads it
    except (OSError, RuntimeError, ImportError, SystemExit) as exc:  # no compiler, a failed build, a bad file
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        return f"the q4 kernel could not be built here ({lines[-1][:160]})"
    return None


def build() -> Path:
    """Compile the kernel into `build_dir()` (about a minute on 2 cores); returns the library."""
    from torch.utils.cpp_extension import load

    import fcntl

    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.lock", "w") as lock:  # two processes (test workers) build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        library = folder / f"{NAME}.so"
        if library.is_file():  # built by the other process while this one waited
            torch.ops.load_library(str(library))
        else:
            load(name=NAME, sources=[str(source) for source in SOURCES], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                 build_directory=str(folder), is_python_module=False, verbose=False)
    return library


def main() -> None:
    """`python -m mars_cli.decoding.kernels`: build now (make setup), and say where or why not."""
    why = problem()
    print(f"mars q4 kernel: {why or build_dir() / (NAME + '.so')}")
