"""The CMake flags that build llama.cpp (through llama-cpp-python) for this machine.

Run as a script, standard library only, before the binding exists: `python3 build_flags.py`
prints the CMAKE_ARGS for `pip install llama-cpp-python`. A native build (-march=native) is what
llama.cpp does by default; it is kept unless the processor lists AMX but the kernel does not let
a process use the tiles (seen on virtual machines: any batch of more than one token then died of a
general protection fault at `ldtilecfg`). There the build targets the vector extensions the
processor lists, AMX off.
"""

from __future__ import annotations

import ctypes
import platform
import sys

ARCH_GET_XCOMP_PERM, ARCH_REQ_XCOMP_PERM = 0x1022, 0x1023
XFEATURE_XTILEDATA = 18
SYS_ARCH_PRCTL = 158  # x86_64
VECTOR_FLAGS = {  # /proc/cpuinfo flag -> ggml's CMake option
    "avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C", "bmi2": "GGML_BMI2",
    "avx512f": "GGML_AVX512", "avx512vbmi": "GGML_AVX512_VBMI", "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16", "avx_vnni": "GGML_AVX_VNNI",
}
AMX_OPTIONS = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


def cpu_flags() -> set[str]:
    """The processor's flags as /proc/cpuinfo lists them (none where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as handle:
            lines = [line for line in handle if line.startswith("flags")]
    except OSError:
        return set()
    return set(lines[0].split(":", 1)[1].split()) if lines else set()


def amx_usable() -> bool:
    """Whether this process may use AMX tiles: the kernel grants XTILEDATA (Linux 5.16+)."""
    if platform.machine() != "x86_64" or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0:
        return False
    granted = ctypes.c_ulong(0)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(granted)) != 0:
        return False
    return bool(granted.value & (1 << XFEATURE_XTILEDATA))


def cmake_args(flags: set[str] | None = None, amx: bool | None = None) -> list[str]:
    """-D options for this machine: [] (llama.cpp's native default) unless AMX is listed and refused."""
    flags = cpu_flags() if flags is None else flags
    listed = "amx_tile" in flags
    amx = amx_usable() if amx is None and listed else bool(amx)
    if not listed or amx:
        return []
    wanted = [f"-D{option}={'ON' if flag in flags else 'OFF'}" for flag, option in VECTOR_FLAGS.items()]
    return ["-DGGML_NATIVE=OFF", *wanted, *(f"-D{option}=OFF" for option in AMX_OPTIONS)]


if __name__ == "__main__":
    print(" ".join(cmake_args()))
