"""The README's `mars eval --engine vllm` line, exactly, with no VLLM_CPU_KVCACHE_SPACE set and a
process holding a share of the memory: vLLM's CPU backend alone claims 92% of RAM per engine and
did not start even on a quiet machine; sized by memory.py, both engines start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mars_cli.serving.memory import GiB, memory_status

README_LINE = ["eval", "--engine", "vllm", "--batch-size", "16", "--suite", "chat,code", "--draft", "head",
               "--methods", "vanilla,strict,mars"]
HOG_SHARE = 0.35  # of the memory available when the test starts


def test_the_readme_eval_line_starts_beside_a_process_holding_memory(tmp_path):
    hold = int(memory_status().available * HOG_SHARE)
    hog = subprocess.Popen([sys.executable, "-c",
                            f"import sys, time\nheld = bytearray({hold})\nheld[::4096] = b'x' * len(held[::4096])\n"
                            "print('holding', flush=True)\ntime.sleep(900)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout.readline().strip() == "holding"  # its pages are touched: resident, not just reserved
        environment = {name: value for name, value in os.environ.items() if name != "VLLM_CPU_KVCACHE_SPACE"}
        mars = Path(sys.executable).parent / "mars"
        out = tmp_path / "run"
        finished = subprocess.run([str(mars), *README_LINE, "--limit", "1", "--out", str(out), "--json"],
                                  capture_output=True, text=True, env=environment, timeout=900)
    finally:
        hog.kill()
        hog.wait()
    assert finished.returncode == 0, finished.stderr[-4000:]
    chosen = [line for line in finished.stderr.splitlines() if "vLLM on CPU: a KV cache of" in line]
    assert len(chosen) == 1 and "for 2 engines" in chosen[0], chosen  # vanilla's, and the head's for strict and mars
    assert json.loads(finished.stdout)["table"]["chat"], f"held {hold / GiB:.1f} GiB"
