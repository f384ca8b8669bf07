"""Which machine a measurement belongs to, and whether it is busy now.

A cached speed is only valid on the machine, kernels, threads and torch it was taken with
(`machine_key`); and a speed taken while another job shares the cores is wrong, not noisy
(`busy_reason`): such a measurement is kept as provisional (choice.py), never as the answer.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from pathlib import Path

import torch

# the CPU features a matrix kernel's speed turns on (x86 and Arm names, as /proc/cpuinfo lists them)
MATRIX_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                "amx_int8", "asimd", "sve", "sve2", "bf16", "i8mm", "sme")
# environment variables that cap the instruction set oneDNN's kernels use (its old and new names)
ONEDNN_ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
LOAD_HEADROOM = 0.5  # load average above usable cores + this before measuring: the machine is busy
# Other processes using more than this many of our cores, sampled just before measuring: busy. The
# one-minute load average lags a job that started seconds ago, and on 2 cores two spinning processes
# hold it at 2.0, under the rule above, while every forward of ours shares a core with one of them.
OTHERS_BUSY = 0.5
SAMPLE_S = 0.2  # how long the CPU times are sampled


def machine_key(model_fingerprint: str, device: torch.device) -> dict:
    """What any measurement of a model's speed depends on that can change between runs on one
    machine: the model, the device (the CPU's or GPU's name, and a CPU's matrix instruction sets:
    two CPUs sold under one name may differ in AMX or AVX-512), the kernels, threads and torch."""
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = " ".join([cpu_name(), *cpu_matrix_flags()])
    return {
        "model": model_fingerprint,
        "device": f"{device.type}:{device_name}",
        "kernels": cpu_kernels() if device.type == "cpu" else "",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def machine_facts() -> dict:
    """The CPU, its matrix instruction sets, the threads and torch: what a benchmark's figures are
    printed and stored beside (never carried from one machine to another)."""
    return {"cpu": cpu_name(), "flags": cpu_matrix_flags(), "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def cpu_kernels() -> str:
    """The instruction set the CPU kernels actually run with, which is not always what the CPU
    lists (`ATEN_CPU_CAPABILITY=avx2`, `ONEDNN_MAX_CPU_ISA=AVX2`): a measurement taken under such
    a cap must not serve a run without it, nor the reverse."""
    caps = [f"{name}={os.environ[name]}" for name in ONEDNN_ISA_VARIABLES if os.environ.get(name)]
    return " ".join([torch.backends.cpu.get_cpu_capability(), *caps])


@functools.cache
def _cpuinfo() -> tuple[str, ...]:
    """/proc/cpuinfo's lines, read once per process (Linux; elsewhere none)."""
    info = Path("/proc/cpuinfo")
    return tuple(info.read_text().splitlines()) if info.is_file() else ()


def cpu_matrix_flags() -> list[str]:
    """Which of MATRIX_FLAGS this CPU lists (Linux; elsewhere none are known)."""
    for line in _cpuinfo():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            present = set(value.split())
            return [flag for flag in MATRIX_FLAGS if flag in present]
    return []


def cpu_name() -> str:
    """The CPU's model name (Linux), else what the platform module reports."""
    names = [line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_reason() -> str | None:
    """Why a speed measurement taken now would not be representative, or None: a load average
    above the cores this process may use plus LOAD_HEADROOM, or other processes using more than
    OTHERS_BUSY of those cores right now (`others_load`): another job would share every step."""
    cores = usable_cores()
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # not on this platform
        load = None
    if load is not None and load > cores + LOAD_HEADROOM:
        return f"load average {load:.1f} on {cores} cores: a busy machine"
    others = _recent_others_load()
    if others is not None and others > OTHERS_BUSY:
        return f"other processes use {others:.1f} of {cores} cores: a busy machine"
    return None


_SAMPLED: list[tuple[float, object, float | None]] = []  # this process's last sample: when, by what, what
SAMPLE_FRESH_S = 5.0  # a sample this recent answers again: one process's measurements ask in a row


def _recent_others_load() -> float | None:
    """`others_load()`, or the sample it gave this process in the last SAMPLE_FRESH_S seconds."""
    if _SAMPLED and time.monotonic() - _SAMPLED[-1][0] < SAMPLE_FRESH_S and _SAMPLED[-1][1] is others_load:
        return _SAMPLED[-1][2]
    _SAMPLED[:] = [(time.monotonic(), others_load, others_load())]
    return _SAMPLED[-1][2]


def others_load(seconds: float = SAMPLE_S) -> float | None:
    """How many of this process's cores other processes kept busy over the next `seconds` (Linux:
    /proc/stat less this process's own CPU time); None where that cannot be read."""
    cpus = {f"cpu{n}" for n in _affinity()}
    try:
        busy_before, own_before = _busy_ticks(cpus), _own_ticks()
        time.sleep(seconds)
        busy_after, own_after = _busy_ticks(cpus), _own_ticks()
    except (OSError, ValueError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK") * seconds
    return max(0.0, (busy_after - busy_before) - (own_after - own_before)) / ticks


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _busy_ticks(cpus: set[str]) -> int:
    """Clock ticks the CPUs in `cpus` spent on anything but idling and waiting for I/O."""
    total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        fields = line.split()
        if fields and fields[0] in cpus:
            values = [int(v) for v in fields[1:9]]
            total += sum(values) - values[3] - values[4]  # less idle and iowait
    return total


def _own_ticks() -> int:
    """Clock ticks this process (all its threads) spent on the CPU."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime
