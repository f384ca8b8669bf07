"""`mars serve` end to end: the real command starts vLLM's OpenAI-compatible server for the embedded
SmolLM2-135M with n-gram drafts and MARS at theta 0.9, which answers /v1/completions over HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

START_TIMEOUT_S = float(os.environ.get("MARS_SERVE_TIMEOUT", "150"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def request(url: str, payload: dict | None = None, timeout: float = 60) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    sent = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(sent, timeout=timeout) as response:
        return json.loads(response.read())


def wait_for_models(base: str, server: subprocess.Popen, log: Path) -> dict:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"mars serve exited with {server.returncode}:\n{log.read_text()[-4000:]}")
        try:
            return request(f"{base}/v1/models", timeout=5)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1)
    raise AssertionError(f"no answer from {base}/v1/models in {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-4000:]}")


def stop(server: subprocess.Popen) -> None:
    """The server and every process it started (vLLM's engine core): its whole process group."""
    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)


def test_mars_serve_answers_completions(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    mars = Path(sys.executable).parent / "mars"
    command = [str(mars), "serve", "smollm2-135m", "--draft", "ngram", "--threshold", "0.9", "--port", str(port),
               "--host", "127.0.0.1", "--enforce-eager", "--max-model-len", "1024"]
    with log.open("wb") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                                  env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="INFO"))
    try:
        served = wait_for_models(base, server, log)
        model = served["data"][0]["id"]
        answer = request(f"{base}/v1/completions", {
            "model": model, "prompt": "The three primary colours are red, yellow and blue. The three primary colours are",
            "max_tokens": 16, "temperature": 0})
        text = answer["choices"][0]["text"]
        assert text.strip() and answer["usage"]["completion_tokens"] >= 1
    finally:
        stop(server)
    written = log.read_text()
    assert "mars: note: MARS on: logit-ratio theta 0.9 (greedy), 0.9 (sampled, at T = 1), given" in written
    assert '"method": "ngram"' in written
    assert re.search(r"MARS: \d+ of [1-9]\d* drafts accepted, \d+ of them relaxed", written)  # the plugin decided
