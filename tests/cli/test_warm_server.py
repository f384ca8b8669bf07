"""The warm server's reliability (issue 71): a request gets exactly what a fresh process would get,
or a fresh process decodes it; no client can keep another waiting; the server stops decoding for a
client that is gone; its memory follows the sessions it keeps. Real processes throughout: a
server, clients that go silent, are suspended (SIGSTOP) or interrupted (SIGINT), and files
replaced under a running server. Every process is bounded (a hang fails the test, never CI).

Some tests run a "slow" server: the real server with each decoded chunk delayed, so that a
decoding is still under way when a test interrupts its client."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from mars_cli.warm import address as addresses
from tests.cli.test_startup import EXACT, environment, wait_for  # noqa: F401 - the fixture
from tests.conftest import build_tokenizer, save_model_dir

ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 150  # any one process: past this it hung (a cold one-liner takes ~20 s on a busy 2-core machine)
# the real server, each decoded chunk delayed by SLOW_CHUNK_S: a decoding is still under way when a test acts
SLOW_SERVER = """
import os, sys, time
from mars_cli import session
stream = session.Session.stream
def slow(self, *args, **kwargs):
    for chunk in stream(self, *args, **kwargs):
        time.sleep(float(os.environ["SLOW_CHUNK_S"]))
        yield chunk
session.Session.stream = slow
from mars_cli.warm.server import main
sys.exit(main(sys.argv[1:]))
"""


# ----------------------------------------------------------------------------- helpers
@pytest.fixture()
def env(environment):
    """The test's own environment (cache, profiles, runtime folder), decoding in process unless
    `on(env)` asks the server; PYTHONPATH: every process, the server too, runs this checkout (and
    makes the server's key its own: it is stopped here)."""
    own = {**environment, "PYTHONPATH": str(ROOT)}
    yield own
    stopped = subprocess.run([sys.executable, "-m", "mars_cli.cli", "serve", "--local", "--stop"], env=own, cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr


def on(env: dict) -> dict:
    return {**env, "MARS_SERVER": "on"}


def mars(*args: str, env: dict, cwd: Path = ROOT, timeout: float = LIMIT_S) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "mars_cli.cli", *args], env=env, cwd=cwd, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`mars {' '.join(args[:3])} ...` hung for {timeout} s")


def popen(*args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mars_cli.cli", *args], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def answer(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("mars: error:")]


def place(env: dict) -> addresses.Address:
    """The address the clients of `env` use (its folder made, as a first client makes it)."""
    code = "from mars_cli.warm import address as a; p = a.here(create=True); print(p.folder); print(p.key)"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    folder, key = done.stdout.split()
    return addresses.Address(Path(folder), key)


def start_server(env: dict) -> addresses.Address:
    done = mars("serve", "--local", env=env)
    assert done.returncode == 0, done.stderr
    address = place(env)
    assert wait_for(lambda: address.socket.exists(), 60)
    return address


@pytest.fixture()
def slow_server(env):
    """Start the slow server (SLOW_CHUNK_S seconds a chunk) for `env`; yields its address and process."""
    started: list[subprocess.Popen] = []

    def start(seconds: float) -> tuple[addresses.Address, subprocess.Popen]:
        address = place(env)
        with open(address.log, "ab") as log:
            process = subprocess.Popen([sys.executable, "-c", SLOW_SERVER, "--key", address.key], cwd=ROOT,
                                       env={**env, "SLOW_CHUNK_S": str(seconds)}, stdout=log, stderr=log,
                                       start_new_session=True)
        started.append(process)
        assert wait_for(lambda: listening(address) or process.poll() is not None, 60), "no slow server"
        assert process.poll() is None, address.log.read_text()
        return address, process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(30)


def listening(address: addresses.Address) -> bool:
    """Whether a server answers on the socket (a killed one's socket file stays behind)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(address.socket))
        except OSError:
            return False
    return True


def log_has(address: addresses.Address, text: str, seconds: float = 60) -> bool:
    return wait_for(lambda: address.log.exists() and text in address.log.read_text(), seconds)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def raw(address: addresses.Address, line: bytes, seconds: float = 60) -> list[dict]:
    """Send one raw line; the events answered until the server closes the connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(seconds)
        connection.connect(str(address.socket))
        connection.sendall(line)
        data = b""
        while chunk := connection.recv(1 << 16):
            data += chunk
    return [json.loads(event) for event in data.splitlines()]


def request(address: addresses.Address, **fields: object) -> bytes:
    body = {"protocol": addresses.PROTOCOL, "stamp": addresses.code_stamp(), "key": address.key, **fields}
    return json.dumps(body).encode() + b"\n"


def finish(process: subprocess.Popen) -> None:
    """End a client the test started (resumed first if it was suspended)."""
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.kill()
    process.wait(30)
    for stream in (process.stdout, process.stderr):
        stream.close()


def printed(process: subprocess.Popen) -> bool:
    """Whether the process has written something on stdout (read without waiting)."""
    try:
        return bool(os.read(process.stdout.fileno(), 1))
    except BlockingIOError:
        return False


@pytest.fixture(scope="session")
def long_dir(tmp_path_factory) -> Path:
    """A tiny model with a 4096-token context that never ends its answer (EOS's output row is
    zero, so some other token always scores higher): long answers, thousands of events."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        model.lm_head.weight[2].zero_()
    path = tmp_path_factory.mktemp("long-context")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# ----------------------------------------------------------------------------- item 1: model files
def test_a_replaced_truncated_or_deleted_model_file_is_never_served(env, tmp_path, tiny_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    other = save_model_dir(tmp_path / "other", seed=7)
    args = ("generate", "Tell me a story", "--target", str(model), "-n", "12", "--json", *EXACT)
    start_server(env)
    first = answer(mars(*args, env=on(env)))
    assert first["server"] is not None

    shutil.copyfile(other / "model.safetensors", model / "model.safetensors")  # other weights, same size
    warm, cold = answer(mars(*args, env=on(env))), answer(mars(*args, env=env))
    assert warm["server"] is not None and warm["server"]["session"] == "built"
    assert warm["token_ids"] == cold["token_ids"] != first["token_ids"]

    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])  # truncated
    warm, cold = mars(*args, env=on(env)), mars(*args, env=env)
    assert cold.returncode == 2 and (warm.returncode, warm.stdout, errors(warm)) == (2, "", errors(cold)), warm.stderr

    weights.unlink()  # deleted
    warm, cold = mars(*args, env=on(env)), mars(*args, env=env)
    assert cold.returncode == 2 and (warm.returncode, warm.stdout, errors(warm)) == (2, "", errors(cold)), warm.stderr


# ----------------------------------------------------------------------------- item 2: tuning entries
def test_changed_or_deleted_tuning_entries_are_read_as_a_fresh_process_reads_them(env, tiny_dir):
    env = {**env, "MARS_TUNING_BUDGET_S": "0"}  # nothing measured: the entries alone decide
    args = ("generate", "Tell me a story", "--target", str(tiny_dir), "-n", "12", "--json", "--device", "cpu",
            "--dtype", "auto", "--packed-weights", "off", "--draft", "none", "--int8-head", "off")
    cold = answer(mars(*args, env=env))  # writes the dtype entry (float32, unmeasured)
    assert cold["config"]["dtype"] == "float32"
    start_server(env)
    assert answer(mars(*args, env=on(env)))["config"]["dtype"] == "float32"
    assert answer(mars(*args, env=on(env)))["server"]["session"] == "reused"

    # `mars tune` found bfloat16 faster here
    folder = Path(env["MARS_CACHE"]) / "dtypes"
    (entry,) = folder.glob("*.json")
    data = json.loads(entry.read_text())
    data.update(chosen="bfloat16", provisional=None, candidates=[
        {"dtype": "float32", "usable": True, "agreement": 1.0, "ms_per_step": 10.0, "spread": 1.0, "repeats": 5},
        {"dtype": "bfloat16", "usable": True, "agreement": 1.0, "ms_per_step": 5.0, "spread": 1.0, "repeats": 5}])
    entry.write_text(json.dumps(data))
    warm, cold = answer(mars(*args, env=on(env))), answer(mars(*args, env=env))
    assert cold["config"]["dtype"] == "bfloat16"
    assert warm["server"] is not None and warm["config"]["dtype"] == "bfloat16"
    assert warm["token_ids"] == cold["token_ids"]

    shutil.rmtree(folder)  # the cache folder deleted: unmeasured again, float32
    warm = answer(mars(*args, env=on(env)))
    cold = answer(mars(*args, env=env))
    assert warm["server"] is not None and warm["config"]["dtype"] == cold["config"]["dtype"] == "float32"
    assert warm["token_ids"] == cold["token_ids"]


# ----------------------------------------------------------------------------- item 3: profiles, package files
def profile(path: Path, fingerprint: str, theta: float) -> Path:
    path.write_text(json.dumps({
        "schema": 1, "model": {"name": "tiny", "source": "test", "fingerprint": fingerprint, "vocab_size": 70},
        "thresholds": {"logit-ratio": theta}, "temperature": 0.0, "objective": {}, "samples": 1, "prompt_set": {},
        "quantiles": {}, "tool_version": "test", "created": "today", "command": "test"}))
    return path


def test_an_edited_or_added_calibration_profile_is_read_as_a_fresh_process_reads_it(env, tmp_path, tiny_dir,
                                                                                   monkeypatch):
    from mars_cli.models.fingerprint import file_fingerprint

    monkeypatch.setenv("MARS_CACHE", env["MARS_CACHE"])
    calibration = profile(tmp_path / "theta.yaml", "not-this-model", 0.5)
    args = ("generate", "Tell me a story", "--target", str(tiny_dir), "-n", "12", "--json", *EXACT,
            "--verify", "mars")
    start_server(env)
    named = (*args, "--calibration", str(calibration), "--force")
    assert answer(mars(*named, env=on(env)))["config"]["threshold"] == 0.5
    profile(calibration, "not-this-model", 0.25)  # edited in place
    warm, cold = answer(mars(*named, env=on(env))), answer(mars(*named, env=env))
    assert warm["server"] is not None and warm["config"]["threshold"] == cold["config"]["threshold"] == 0.25

    assert answer(mars(*args, env=on(env)))["config"]["threshold_source"] == "default"
    users = Path(env["MARS_PROFILES"])
    users.mkdir(parents=True, exist_ok=True)
    profile(users / "tiny.yaml", file_fingerprint(tiny_dir), 0.75)  # a profile for this model, added
    warm, cold = answer(mars(*args, env=on(env))), answer(mars(*args, env=env))
    assert warm["server"] is not None and warm["config"]["threshold"] == cold["config"]["threshold"] == 0.75


def test_the_code_stamp_covers_every_file_of_the_package(tmp_path, monkeypatch):
    package = tmp_path / "mars_cli"
    for name in ("cli.py", "profiles/model.yaml", "heads/h/config.json", "decoding/kernels/ops.cpp",
                 "data/prompts.jsonl"):
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text("one")
    monkeypatch.setattr(addresses, "PACKAGE", package)
    stamps = {addresses.code_stamp()}
    for name in ("profiles/model.yaml", "heads/h/config.json", "decoding/kernels/ops.cpp", "data/prompts.jsonl"):
        time.sleep(0.01)
        (package / name).write_text("two")
        stamps.add(addresses.code_stamp())
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "cli.cpython-311.pyc").write_text("bytecode")
    stamps.add(addresses.code_stamp())  # bytecode follows the sources: no new stamp
    assert len(stamps) == 5


# ----------------------------------------------------------------------------- item 4: silent clients
def test_a_silent_or_half_sent_request_keeps_no_one_waiting(env, tiny_dir):
    address = start_server(env)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    half = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        silent.connect(str(address.socket))
        half.connect(str(address.socket))
        half.sendall(b'{"protocol": 1, "stamp": ')
        done = answer(mars("generate", "Hi", "--target", str(tiny_dir), "-n", "4", "--json", *EXACT, env=on(env),
                           timeout=90))
        assert done["server"] is not None
        stopped = mars("serve", "--local", "--stop", env=env, timeout=60)
        assert stopped.returncode == 0 and "warm server stopped" in stopped.stderr, stopped.stderr
    finally:
        silent.close()
        half.close()


def test_a_one_liner_decodes_itself_rather_than_wait_for_another_clients_decoding(env, tiny_dir, slow_server):
    address, _ = slow_server(0.1)
    long = popen("generate", "Tell me a story", "--target", str(tiny_dir), "-n", "200", "--json", *EXACT,
                 "--draft", "none", env=on(env))
    try:
        assert log_has(address, f"pid {long.pid}: decoding")
        args = ("generate", "Hi", "--target", str(tiny_dir), "-n", "6", "--json", *EXACT)
        waited = answer(mars(*args, env=on(env), timeout=90))
        assert waited["server"] is None  # the server was busy: decoded in its own process
        assert waited["token_ids"] == answer(mars(*args, env=env))["token_ids"]
    finally:
        finish(long)


# ----------------------------------------------------------------------------- item 5: a suspended client
def test_a_suspended_client_is_dropped_and_keeps_no_one_waiting(env, tiny_dir, long_dir):
    address = start_server(env)
    suspended = popen("generate", "Go on", "--target", str(long_dir), "-n", "3000", *EXACT, "--draft", "none",
                      env=on(env))
    try:
        assert log_has(address, f"pid {suspended.pid}: decoding")
        suspended.send_signal(signal.SIGSTOP)  # Ctrl-Z: it reads nothing more; its socket fills
        done = answer(mars("generate", "Hi", "--target", str(tiny_dir), "-n", "4", "--json", *EXACT, env=on(env)))
        assert done["new_tokens"] == 4
        assert log_has(address, f"pid {suspended.pid}: client read nothing for")  # dropped, its decoding stopped
        assert answer(mars("generate", "Hi", "--target", str(tiny_dir), "-n", "4", "--json", *EXACT,
                           env=on(env)))["server"] is not None
    finally:
        finish(suspended)


# ----------------------------------------------------------------------------- item 6: Ctrl-C of a --json client
def test_the_server_stops_decoding_for_an_interrupted_json_client(env, tiny_dir, slow_server):
    address, _ = slow_server(0.1)
    args = ("generate", "Tell me a story", "--target", str(tiny_dir), "-n", "200", "--json", *EXACT,
            "--draft", "none")
    client = popen(*args, env=on(env))
    try:
        assert log_has(address, f"pid {client.pid}: decoding")
        client.send_signal(signal.SIGINT)
        assert client.wait(60) == 130
        assert log_has(address, f"pid {client.pid}: client went away", 30)
        quick = answer(mars("generate", "Hi", "--target", str(tiny_dir), "-n", "2", "--json", *EXACT, env=on(env)))
        assert quick["server"] is not None  # the decoder was free again, not busy with the lost request
    finally:
        finish(client)


# ----------------------------------------------------------------------------- item 7: bad requests
def test_a_folder_it_cannot_enter_or_a_request_that_is_no_object_does_not_end_the_server(env, tmp_path, tiny_dir):
    address = start_server(env)
    for line in (b"[1, 2]\n", b"42\n", b'"text"\n', b"null\n", b"{not json\n"):
        assert raw(address, line) == []  # dropped, logged
    options = {"target": str(tiny_dir), "max_new_tokens": 2, "device": "cpu", "dtype": "float32"}
    for cwd in (str(tmp_path / "gone"), str(tiny_dir / "config.json"), None, 7):
        events = raw(address, request(address, cwd=cwd, options=options, text="Hi"))
        assert len(events) == 1 and events[0]["code"] == 2 and "working directory" in events[0]["error"], events
    events = raw(address, request(address, cwd=str(tmp_path), options=["not", "an", "object"], text="Hi"))
    assert events[-1]["code"] == 2

    folder = tmp_path / "here"
    folder.mkdir()
    done = answer(mars("generate", "Hi", "--target", str(tiny_dir), "-n", "2", "--json", *EXACT, env=on(env),
                       cwd=folder))
    assert done["server"] is not None  # still serving
    assert wait_for(lambda: os.readlink(f"/proc/{done['server']['pid']}/cwd") == "/", 30)  # not in the client's folder


# ----------------------------------------------------------------------------- item 8: per-call options
def test_per_call_options_reuse_the_session_and_memory_stays_bounded(env, tiny_dir):
    base = ("generate", "Tell me a story", "--target", str(tiny_dir), "--json", *EXACT)
    start_server(env)
    first = answer(mars(*base, "-n", "8", env=on(env)))
    pid = first["server"]["pid"]
    after_first = rss_kib(pid)
    variants = [("-n", "9"), ("-n", "10", "--seed", "1"), ("--temperature", "0.8", "--seed", "3", "-n", "8"),
                ("--temperature", "0.7", "--seed", "4", "-n", "8"), ("--top-k", "5", "--temperature", "1", "-n", "8"),
                ("--top-p", "0.9", "--temperature", "1", "-n", "8", "--seed", "5"), ("-n", "11"), ("-n", "12"),
                ("--seed", "9", "-n", "8"), ("--temperature", "0.9", "-n", "7", "--seed", "2"), ("-n", "6")]
    answers = {}
    for variant in variants:
        done = answer(mars(*base, *variant, env=on(env)))
        assert done["server"] == {"pid": pid, "session": "reused"}, variant
        answers[variant] = done
    after_twelve = rss_kib(pid)
    assert after_twelve <= 1.3 * after_first, (after_first, after_twelve)
    for variant in (variants[2], variants[5]):  # sampled: the server's draws are a fresh process's
        cold = answer(mars(*base, *variant, env=env))
        assert answers[variant]["token_ids"] == cold["token_ids"] and answers[variant]["config"] == cold["config"]
    # a budget past the window is refused on the reused session as a process refuses it
    refused = mars(*base, "-n", "300", env=on(env))
    assert refused.returncode == 2 and errors(refused) == [
        "mars: error: --max-new-tokens 300 is beyond the model's context window (256)"]


# ----------------------------------------------------------------------------- item 9: start, stop, keys, deaths
def test_serve_local_says_why_a_server_cannot_start(env):
    address = place(env)
    address.socket.mkdir()  # a folder where the socket belongs
    done = mars("serve", "--local", env=env, timeout=90)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "is a folder" in done.stderr and "Traceback" not in done.stderr
    address.socket.rmdir()

    runtime = Path(tempfile.mkdtemp(prefix="mw", dir="/tmp")) / ("x" * 90)
    runtime.mkdir()
    done = mars("serve", "--local", env={**env, "XDG_RUNTIME_DIR": str(runtime)}, timeout=90)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "over the 107" in done.stderr
    shutil.rmtree(runtime.parent)


def test_stop_finds_a_server_whose_folder_was_opened_and_on_says_why_none_is_used(env, tiny_dir):
    address = start_server(env)
    pid = int(address.log.read_text().split("[", 1)[1].split("]", 1)[0])
    os.chmod(address.folder, 0o755)
    generated = mars("generate", "Hi", "--target", str(tiny_dir), "-n", "2", "--json", *EXACT, env=on(env))
    assert answer(generated)["server"] is None
    said = [line for line in generated.stderr.splitlines() if "MARS_SERVER=on" in line]
    assert len(said) == 1 and "open to other users" in said[0]
    stopped = mars("serve", "--local", "--stop", env=env, timeout=60)
    assert stopped.returncode == 0 and f"warm server stopped (pid {pid})" in stopped.stderr, stopped.stderr
    assert wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30)
    os.chmod(address.folder, 0o700)


def test_per_login_variables_do_not_change_the_environment_key(monkeypatch):
    key = addresses.environment_key()
    for name, value in (("XDG_SESSION_ID", "42"), ("XDG_VTNR", "7"), ("XDG_SEAT", "seat1"),
                        ("XDG_SESSION_TYPE", "tty"), ("XDG_SESSION_CLASS", "user")):
        monkeypatch.setenv(name, value)
    assert addresses.environment_key() == key
    monkeypatch.setenv("XDG_CACHE_HOME", "/elsewhere")  # another cache: another server
    assert addresses.environment_key() != key


def test_a_server_that_dies_mid_answer_is_retried_here_or_said_in_one_line(env, tiny_dir, slow_server):
    args = ("generate", "Tell me a story", "--target", str(tiny_dir), "-n", "200", *EXACT, "--draft", "none")
    address, server = slow_server(0.1)
    client = popen(*args, "--json", env=on(env))  # nothing printed before the end: decoded here again
    try:
        assert log_has(address, f"pid {client.pid}: decoding")
        server.kill()
        out, err = client.communicate(timeout=LIMIT_S)
        assert client.returncode == 0, err
        assert json.loads(out)["server"] is None and json.loads(out)["token_ids"] == answer(mars(*args, "--json",
                                                                                                 env=env))["token_ids"]
    finally:
        finish(client)

    address, server = slow_server(0.2)
    client = popen(*args, env=on(env))  # streaming: text is out when the server dies
    try:
        assert log_has(address, f"pid {client.pid}: decoding")
        os.set_blocking(client.stdout.fileno(), False)
        assert wait_for(lambda: printed(client), 60)
        os.set_blocking(client.stdout.fileno(), True)
        server.kill()
        _, err = client.communicate(timeout=60)
        assert client.returncode == 75, err
        said = err.strip().splitlines()
        assert len(said) == 1 and said[0].startswith("mars: error: the warm server stopped mid-answer"), err
    finally:
        finish(client)


def test_a_folder_of_another_users_or_open_to_others_is_named_as_such(tmp_path):
    folder = tmp_path / "mars-cli"
    assert addresses.folder_problem(folder) is None  # none yet: no server has run
    folder.mkdir(mode=0o700)
    assert addresses.folder_problem(folder) is None and addresses.private_folder(folder, create=False)
    os.chmod(folder, 0o755)
    assert "open to other users (mode 0755" in addresses.folder_problem(folder)
    assert addresses.owned_folder(folder) and not addresses.private_folder(folder, create=False)
    os.chmod(folder, 0o700)
    if os.getuid() == 0:  # only root can hand a folder to another user
        os.chown(folder, 65534, 65534)
        assert addresses.folder_problem(folder) == "belongs to another user (uid 65534)"
        assert not addresses.owned_folder(folder)


def test_reads_keep_first_identities_and_a_builds_own_writes(tmp_path):
    from mars_cli import reads

    entry, model = tmp_path / "entry.json", tmp_path / "model"
    model.mkdir()
    (model / "weights").write_text("a")
    reads.read(entry)  # outside a recording: nothing kept, nothing raised
    with reads.recording() as request, reads.recording(writes=True) as build:
        reads.read(entry)  # absent
        reads.read_path(model)
        entry.write_text("measured")
        reads.wrote(entry)  # what the build wrote, a fresh process would read
    assert reads.changed(build) == [] and reads.changed(request) == [str(entry)]
    (model / "weights").write_text("b, longer")
    assert reads.changed(build) == [str(model / "weights")]
    (model / "extra").write_text("new")
    assert str(model) in reads.changed(build)  # an entry added to a folder read whole
