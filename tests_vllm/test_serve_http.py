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


def request(url: str, payload: dict | None = None, timeout: float = 60, key: str | None = None) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    sent = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(sent, timeout=timeout) as response:
        return json.loads(response.read())


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on `port`, as the kernel lists them
    (/proc/net/tcp and tcp6: hex address:port, state 0A is LISTEN)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                raw = bytes.fromhex(address)
                if width == 8:
                    found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                else:  # four little-endian 32-bit words
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def wait_for_models(base: str, server: subprocess.Popen, log: Path, key: str | None = None) -> dict:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"mars serve exited with {server.returncode}:\n{log.read_text()[-4000:]}")
        try:
            return request(f"{base}/v1/models", timeout=5, key=key)
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
               "--enforce-eager", "--max-model-len", "1024"]  # no --host: this machine only
    with log.open("wb") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                                  env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="INFO"))
    try:
        served = wait_for_models(base, server, log)
        assert listening_addresses(port) == {"127.0.0.1"}  # not every interface, as vLLM alone binds
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


def test_mars_serve_on_every_interface_takes_a_key(tmp_path):
    """--host 0.0.0.0 listens on every interface (read from the kernel); with --api-key, a request
    without the key is refused."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    mars = Path(sys.executable).parent / "mars"
    command = [str(mars), "serve", "smollm2-135m", "--draft", "ngram", "--threshold", "0.9", "--port", str(port),
               "--host", "0.0.0.0", "--api-key", "mars-test-key", "--enforce-eager", "--max-model-len", "512"]
    environment = {name: value for name, value in os.environ.items() if name != "VLLM_API_KEY"}
    with log.open("wb") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                                  env=dict(environment, VLLM_CPU_KVCACHE_SPACE="1"))
    try:
        wait_for_models(base, server, log, key="mars-test-key")
        assert listening_addresses(port) == {"0.0.0.0"}
        try:
            request(f"{base}/v1/models", timeout=10)
            refused = None
        except urllib.error.HTTPError as exc:
            refused = exc.code
        assert refused == 401
    finally:
        stop(server)
    written = log.read_text()
    assert "listening on: http://0.0.0.0:" in written and "an API key required" in written
    assert "mars: warning:" not in written  # a key was given
