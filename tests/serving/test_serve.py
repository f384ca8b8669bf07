"""`mars serve` without vLLM: what it resolves, the `vllm serve` command it builds (--dry-run), the
flags it passes through, its one-line errors, and how it hands over to vLLM (execve, faked)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from mars_cli import models
from mars_cli.calibration import profiles
from mars_cli.cli import main
from mars_cli.serving import engine, serve

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
SHIPPED = Path(profiles.__file__).parents[1] / "profiles"
needs_fingerprint = pytest.mark.skipif(not hasattr(models, "file_fingerprint"),
                                       reason="models.file_fingerprint (profile and head lookup) is not there yet")


def dry_run(capsys, *args: str) -> tuple[list[str], list[str]]:
    """`mars serve ARGS --dry-run`: the command's words and the stderr lines."""
    code = main(["serve", "--dry-run", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = captured.out.splitlines()
    assert len(lines) == 1
    return shlex.split(lines[0]), captured.err.splitlines()


def value(command: list[str], flag: str) -> str:
    assert command.count(flag) == 1, command
    return command[command.index(flag) + 1]


def test_dry_run_has_the_drafter_and_the_resolved_mapping(capsys, tiny_dir):
    command, err = dry_run(capsys, str(tiny_dir), "--draft", "ngram", "--threshold", "0.5")
    assert command[:3] == ["vllm", "serve", str(tiny_dir)]
    assert json.loads(value(command, "--speculative-config")) == NGRAM
    assert json.loads(value(command, "--additional-config")) == {"mars": {
        "resolved": True, "measure": "logit-ratio", "greedy": 0.5, "sampled": 0.5, "source": "theta"}}
    assert value(command, "--dtype") == "auto"  # vLLM's own choice
    assert "--max-model-len" not in command and "--seed" not in command  # vLLM's defaults
    assert (value(command, "--host"), value(command, "--port")) == ("127.0.0.1", "8000")  # this machine only
    assert err[:4] == [f"mars: note: target: {tiny_dir}",
                       f"mars: note: speculative config: {json.dumps(NGRAM)}",
                       "mars: note: MARS on: logit-ratio theta 0.5 (greedy), 0.5 (sampled, at T = 1), given",
                       "mars: note: listening on: http://127.0.0.1:8000 (this machine only, no API key)"]
    assert err[4:] == [] if "--kv-cache-memory-bytes" not in command else \
        err[4].startswith("mars: note: vLLM on CPU: a KV cache of ")  # sized from the memory at hand


def test_margin_num_draft_and_model_flags_map_onto_vllm(capsys, tiny_dir):
    command, _ = dry_run(capsys, "--target", str(tiny_dir), "--draft", "ngram", "--num-draft", "5",
                         "--threshold", "0.2", "--margin", "prob-ratio", "--dtype", "float32",
                         "--max-model-len", "1024", "--seed", "7")
    assert command[2] == str(tiny_dir)
    assert json.loads(value(command, "--speculative-config"))["num_speculative_tokens"] == 5
    assert json.loads(value(command, "--additional-config"))["mars"]["measure"] == "prob-ratio"
    assert (value(command, "--dtype"), value(command, "--max-model-len"), value(command, "--seed")) == \
        ("float32", "1024", "7")


def test_strict_has_no_additional_config(capsys, tiny_dir):
    command, err = dry_run(capsys, str(tiny_dir), "--draft", "ngram", "--verify", "strict")
    assert "--additional-config" not in command
    assert json.loads(value(command, "--speculative-config")) == NGRAM
    assert err[2] == "mars: note: MARS off: --verify strict, vLLM's own (lossless) verification"


def test_strict_without_a_drafter_is_plain_serving(capsys, tiny_dir):
    command, err = dry_run(capsys, str(tiny_dir), "--draft", "none", "--verify", "strict")
    assert "--speculative-config" not in command and "--additional-config" not in command
    assert err[1] == "mars: note: speculative config: none (--draft none)"


@pytest.mark.parametrize("args, passed", [
    # TARGET first, then ours and vLLM's mixed, then `--`
    (["{tiny}", "--port", "8123", "--draft", "ngram", "--enforce-eager", "--threshold", "0.5", "--",
      "--disable-log-requests"], ["--enforce-eager", "--disable-log-requests"]),
    # --target, then a pass-through flag: click offers "-tp" as TARGET; it is taken back
    (["--target", "{tiny}", "-tp", "1", "--port", "8123", "--draft", "ngram", "--threshold", "0.5",
      "--served-model-name=tiny"], ["-tp", "1", "--served-model-name=tiny"]),
])
def test_pass_through_flags_follow_ours_in_order(capsys, tiny_dir, args, passed):
    command, _ = dry_run(capsys, *[a.format(tiny=tiny_dir) for a in args])
    assert command[2] == str(tiny_dir) and value(command, "--port") == "8123"
    assert command[-len(passed):] == passed
    assert command.index("--additional-config") < len(command) - len(passed)


@needs_fingerprint
@pytest.mark.embedded
def test_embedded_target_takes_the_shipped_profile(capsys):
    command, err = dry_run(capsys, "smollm2-135m", "--draft", "ngram")
    assert command[2] == engine.target_directory("smollm2-135m")
    profile = profiles.load(SHIPPED / "smollm2-135m.yaml")
    mapping = json.loads(value(command, "--additional-config"))["mars"]
    assert mapping == {"resolved": True, "measure": "logit-ratio", "source": str(profile.path),
                       "greedy": profiles.raw_threshold(profile, "logit-ratio", 0.0),
                       "sampled": profiles.raw_threshold(profile, "logit-ratio", 1.0)}
    assert err[0].endswith("(smollm2-135m)") and err[2].startswith("mars: note: MARS on: logit-ratio theta ")
    assert f"profile {profile.path}" in err[2]


@needs_fingerprint
@pytest.mark.embedded
def test_embedded_target_drafts_with_its_head_by_default(capsys):
    command, _ = dry_run(capsys, "smollm2-135m", "--threshold", "0.9")
    speculative = json.loads(value(command, "--speculative-config"))
    assert speculative["method"] == "eagle3" and speculative["num_speculative_tokens"] == 3
    assert Path(speculative["model"], "config.json").is_file()


@needs_fingerprint
def test_a_profile_for_another_model_needs_force(capsys, tiny_dir):
    other = str(SHIPPED / "gemma3-270m.yaml")
    code = main(["serve", str(tiny_dir), "--draft", "ngram", "--calibration", other, "--dry-run"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and err[-1].startswith("mars: error: ") and "calibrated for 'gemma3-270m'" in err[-1]
    assert err[-1].endswith("pass --force")
    command, _ = dry_run(capsys, str(tiny_dir), "--draft", "ngram", "--calibration", other, "--force")
    assert json.loads(value(command, "--additional-config"))["mars"]["source"] == str(profiles.load(other).path)


@pytest.mark.parametrize("args, says", [
    (["--threshold", "1.5"], "--threshold must be in (0, 1]"),
    (["--threshold", "0"], "--threshold must be in (0, 1]"),
    (["--threshold", "nan"], "--threshold must be in (0, 1]"),
    (["--verify", "loose"], "--verify loose: expected strict or mars"),
    (["--margin", "gap"], "--margin gap: expected"),
    (["--draft", "none"], "--draft none drafts nothing"),
    (["--draft", "auto"], "--draft auto is `mars generate`'s"),
    (["--draft", "no-such-model"], "--draft no-such-model: unknown model 'no-such-model'"),
    (["--draft", "head:/nonexistent/head"], "draft head not found"),
    (["--num-draft", "0"], "--num-draft must be between 1 and 16"),
    (["--num-draft", "17"], "--num-draft must be between 1 and 16"),
    (["--dtype", "half"], "--dtype half: expected auto, float32, bfloat16, float16"),
    (["--max-model-len", "0"], "--max-model-len must be at least 1"),
    (["--seed", str(2**64)], "--seed must be an integer between"),
    (["--verify", "strict", "--draft", "ngram", "--threshold", "0.9"], "--threshold sets MARS's threshold"),
    (["--verify", "strict", "--draft", "ngram", "--calibration", "x.yaml"], "--calibration sets MARS's threshold"),
    (["--target", "gemma3-270m"], "two targets: TARGET {tiny} and --target gemma3-270m"),
    (["--draft", "ngram", "--speculative-config", "{}"], "--speculative-config is what `mars serve` writes"),
    (["--draft", "ngram", "-sc={}"], "-sc is what `mars serve` writes"),
    (["--draft", "ngram", "--additional-config.mars.theta", "0.5"], "--additional-config is what `mars serve` writes"),
    (["--draft", "ngram", "--calibration", "/nonexistent.yaml"], "/nonexistent.yaml"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tiny_dir, args, says):
    code = main(["serve", "--dry-run", str(tiny_dir), *args])
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if not line.startswith("mars: note: ")]
    assert code == 2 and captured.out == ""
    assert len(errors) == 1 and errors[0].startswith("mars: error: "), captured.err
    assert says.format(tiny=tiny_dir) in errors[0]
    assert "Traceback" not in captured.err


def test_unknown_target_is_one_line(capsys):
    code = main(["serve", "no-such-model", "--draft", "ngram", "--threshold", "0.9", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("mars: error: unknown model 'no-such-model'") and err.count("\n") == 1


def test_without_vllm_serving_says_how_to_get_it(capsys, tiny_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as where vLLM is not installed: `import vllm` fails
    code = main(["serve", str(tiny_dir), "--draft", "ngram", "--threshold", "0.9"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("mars: error: vLLM is not installed") and err.count("\n") == 1


# ----------------------------------------------------------------------------- handing over to vLLM
class Executed(Exception):
    """What the faked os.execve raises instead of replacing the test process."""


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    """An environment whose bin/ holds python and vllm (vLLM installed as "vllm"), with Intel OpenMP
    in lib/; execve recorded."""
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "vllm").write_text("#!/bin/sh\n")
    (bin_dir / "vllm").chmod(0o755)
    (tmp_path / "env" / "lib").mkdir()
    (tmp_path / "env" / "lib" / "libiomp5.so").write_bytes(b"")
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setattr(engine, "require_vllm", lambda: None)
    monkeypatch.setattr(serve, "_installed_as_vllm", lambda: True)
    monkeypatch.delenv("LD_PRELOAD", raising=False)

    def execve(path, argv, env):
        raise Executed(path, argv, env)

    monkeypatch.setattr(os, "execve", execve)
    return tmp_path / "env"


def test_serve_becomes_the_environments_vllm(capsys, tiny_dir, fake_env, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    with pytest.raises(Executed) as executed:
        main(["serve", str(tiny_dir), "--draft", "ngram", "--threshold", "0.5", "--port", "8123"])
    path, argv, env = executed.value.args
    assert Path(path) == fake_env / "bin" / "vllm" and argv[0] == str(path)
    assert argv[1:4] == ["serve", str(tiny_dir), "--host"] and value(argv, "--port") == "8123"
    assert json.loads(argv[argv.index("--additional-config") + 1])["mars"]["greedy"] == 0.5
    assert env["LD_PRELOAD"] == str(fake_env / "lib" / "libiomp5.so")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"  # the user's
    err = capsys.readouterr().err
    assert "mars: note: MARS on: " in err and f"mars: note: running: vllm serve {tiny_dir} " in err


@pytest.mark.parametrize("installed_as_vllm, script", [(False, True), (True, False)])
def test_without_a_working_vllm_script_this_python_runs_vllms_cli(tiny_dir, fake_env, monkeypatch,
                                                                  installed_as_vllm, script):
    """vllm-cpu's `vllm` script fails at once (it asks for a distribution named "vllm")."""
    monkeypatch.setattr(serve, "_installed_as_vllm", lambda: installed_as_vllm)
    if not script:
        (fake_env / "bin" / "vllm").unlink()
    with pytest.raises(Executed) as executed:
        main(["serve", str(tiny_dir), "--draft", "ngram", "--verify", "strict", "--port", "1"])
    path, argv, _ = executed.value.args
    assert path == sys.executable and argv[:5] == [sys.executable, "-m", "mars_cli.serving.serve", "serve",
                                                   str(tiny_dir)]
    assert value(argv, "--port") == "1"


def test_a_preload_the_user_set_is_kept(tiny_dir, fake_env, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/mine.so")
    with pytest.raises(Executed) as executed:
        main(["serve", str(tiny_dir), "--draft", "ngram", "--verify", "strict"])
    assert executed.value.args[2]["LD_PRELOAD"] == "/usr/lib/mine.so"


def test_no_preload_without_intel_openmp(tiny_dir, fake_env):
    (fake_env / "lib" / "libiomp5.so").unlink()
    with pytest.raises(Executed) as executed:
        main(["serve", str(tiny_dir), "--draft", "ngram", "--verify", "strict"])
    assert "LD_PRELOAD" not in executed.value.args[2]


def test_split_target_keeps_pass_through_order():
    assert serve.split_target(None, None, []) == (models.DEFAULT_TARGET, ())
    assert serve.split_target("m", None, ["--port", "1"]) == ("m", ("--port", "1"))
    assert serve.split_target("--port", "m", ["1", "--enforce-eager"]) == ("m", ("--port", "1", "--enforce-eager"))
    assert serve.split_target("m", "m", []) == ("m", ())


@pytest.mark.parametrize("host, key, warned, where", [
    (None, None, False, "http://127.0.0.1:8000 (this machine only, no API key)"),
    ("::1", None, False, "http://[::1]:8000 (this machine only, no API key)"),
    ("localhost", None, False, "http://localhost:8000 (this machine only, no API key)"),
    ("0.0.0.0", None, True, "http://0.0.0.0:8000 (reachable from other machines, no API key)"),
    ("my-host.example", None, True, "http://my-host.example:8000 (reachable from other machines, no API key)"),
    ("0.0.0.0", "--api-key=k", False, "http://0.0.0.0:8000 (reachable from other machines, an API key required)"),
    ("0.0.0.0", "env", False, "http://0.0.0.0:8000 (reachable from other machines, an API key required)"),
])
def test_the_server_listens_where_asked_and_warns_when_open(capsys, monkeypatch, tiny_dir, host, key, warned,
                                                            where):
    """127.0.0.1 unless --host is given (vLLM alone binds every interface); one warning line for
    a server others can reach with no key; --dry-run shows where it will listen."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    if key == "env":
        monkeypatch.setenv("VLLM_API_KEY", "k")
    args = [str(tiny_dir), "--draft", "ngram", "--threshold", "0.5", *(["--host", host] if host else []),
            *([key] if key not in (None, "env") else [])]
    command, err = dry_run(capsys, *args)
    assert value(command, "--host") == (host or "127.0.0.1")
    assert err[3] == f"mars: note: listening on: {where}"
    warnings = [line for line in err if line.startswith("mars: warning:")]
    assert len(warnings) == int(warned)
    if warned:
        assert f"--host {host} serves the API to every machine" in warnings[0] and "--api-key" in warnings[0]


@pytest.mark.parametrize("args, says", [
    (["--", "--host", "0.0.0.0"], "--host is what `mars serve` writes from --host"),
    (["--port", "0"], "--port must be between 1 and 65535"),
    (["--host", " "], "--host must name an address"),
])
def test_host_and_port_are_checked(capsys, tiny_dir, args, says):
    code = main(["serve", str(tiny_dir), "--draft", "ngram", "--threshold", "0.5", "--dry-run", *args])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and says in err[0]
