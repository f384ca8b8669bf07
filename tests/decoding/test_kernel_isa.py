"""The kernels' instruction sets, chosen at run time (decoding/kernels/tiles.h, quantized_linear.cpp's
`isa()`): the path matches the CPU, AVX2 can be forced, and the AVX512-VNNI code, built into every
library, is never run where the CPU lacks it (no SIGILL): its EVEX-encoded instructions live in the
`vnni::` functions only, which only the run-time choice calls."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mars_cli.decoding import kernels

pytestmark = pytest.mark.skipif(kernels.problem() is not None, reason="this project's kernels are not built here")


def cpu_flags() -> set[str]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    found = re.search(r"^flags\s*:(.*)$", text, re.MULTILINE)
    return set(found.group(1).split()) if found else set()


def test_the_path_is_the_one_this_cpu_has():
    vnni = {"avx512_vnni", "avx512vl", "avx512bw", "avx512f"} <= cpu_flags()
    assert kernels.path() == "avx512-vnni" if vnni else kernels.path() == "avx2"
    assert kernels.path().split()[0] in kernels.version()


def test_avx2_can_be_forced_and_says_so():
    script = "from mars_cli.decoding import kernels; kernels.problem(); print(kernels.path())"
    environment = {**os.environ, "MARS_KERNEL_ISA": "avx2"}
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment,
                           timeout=300, check=True).stdout.strip()
    assert shown.startswith("avx2")


@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump here")
def test_avx512_instructions_live_only_in_the_vnni_functions():
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(kernels.library())],
                             capture_output=True, text=True, timeout=300, check=True).stdout
    evex = re.compile(r"vpdpbusd|zmm|%ymm(1[6-9]|2\d|3[01])|%xmm(1[6-9]|2\d|3[01])|%k[1-7]\b")
    function, outside, inside = "", set(), 0
    for line in listing.splitlines():
        if line.endswith(">:"):
            function = line
        elif evex.search(line):
            if "vnni::" in function:
                inside += 1
            else:
                outside.add(function)
    assert inside > 0 and not outside, sorted(outside)[:3]
