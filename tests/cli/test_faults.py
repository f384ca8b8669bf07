"""Faults as families, with real `mars` processes on the tiny model: interrupts (SIGTERM, SIGKILL)
during calibrate and eval, a full disk under each command's --out and under TMPDIR, and two
commands writing the same output at once. Each checks what is left on disk, not only the exit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mars_cli.calibration import profiles
from mars_cli.cli import main

SMALL_FILE_SYSTEM = "128k"
QUICK = {"MARS_TUNING_BUDGET_S": "0"}  # no measuring in these processes: the tiny model decodes as it comes


def mars(*args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    """`mars ARGS` as its own process (this interpreter, this checkout)."""
    return subprocess.Popen([sys.executable, "-m", "mars_cli.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **QUICK, **(env or {})}, **popen)


def wait_for(condition, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"mars ended ({process.returncode}) first:\n{process.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("timed out waiting")
        time.sleep(0.01)


def calibrate_args(tiny_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["calibrate", "--target", str(tiny_dir), "--device", "cpu", "--out", str(out), "--samples", "3000",
            "--held-out-samples", "10", "--max-new-tokens", "32", *extra]


def eval_args(tiny_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--target", str(tiny_dir), "--device", "cpu", "--suite", "chat", "--limit", "12", "-n", "24",
            "--methods", "vanilla,strict", "--out", str(out), *extra]


# --------------------------------------------------------------------------- interrupts
@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_calibrate_never_leaves_half_a_profile_and_resumes(tmp_path, tiny_dir, cache, sent):
    profile = tmp_path / "p.yaml"
    partial = profile.with_name(profile.name + ".partial.json")
    running = mars(*calibrate_args(tiny_dir, profile))
    wait_for(partial.exists, running)  # the first checkpoint of the sampling
    running.send_signal(sent)
    running.communicate(timeout=60)
    assert not profile.exists()  # never a half-written profile under the real name
    leftover = profile.with_name(profile.name + ".x1y2z3.tmp")  # what a kill inside write_atomic leaves
    leftover.write_text("half a profi")
    resumed = mars(*calibrate_args(tiny_dir, profile, "--resume"))
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    assert "removed 1 temporary file an interrupted run left" in err
    assert profiles.load(str(profile)).data["model"]
    assert not leftover.exists() and not partial.exists()


@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_eval_resumes_with_every_finished_sample_once(capsys, tmp_path, tiny_dir, cache, sent):
    run = tmp_path / "run"
    samples = run / "samples.jsonl"
    running = mars(*eval_args(tiny_dir, run))
    wait_for(lambda: samples.exists() and samples.read_text().count("\n") >= 3, running)
    running.send_signal(sent)
    running.communicate(timeout=60)
    finished_before = [json.loads(line) for line in samples.read_text().splitlines() if line.strip().endswith("}")]
    assert main(eval_args(tiny_dir, run, "--resume", "--json")) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    keys = [(r["suite"], r["sample_id"], r["method"]) for r in records]
    assert len(keys) == len(set(keys)) == 12 * 2  # every sample and method once
    kept = {(r["suite"], r["sample_id"], r["method"]): r["token_ids"] for r in records}
    assert all(kept[(r["suite"], r["sample_id"], r["method"])] == r["token_ids"] for r in finished_before)


# --------------------------------------------------------------------------- a full disk
def full_file_system(tmp_path: Path) -> Path:
    """A folder for a tmpfs that will be full (mounted in the child's own namespaces)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a small file system in a namespace of its own")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"user and mount namespaces are not available here: {probe.stderr.decode().strip()}")
    folder = tmp_path / "full"
    folder.mkdir()
    return folder


def in_full_file_system(folder: Path, command: list[str], env: dict | None = None,
                        before: str = "") -> subprocess.CompletedProcess:
    """Run `command` with a SMALL_FILE_SYSTEM tmpfs at `folder`, `before` (shell) run in it, then
    filled to the last block, as a disk that filled up while mars ran."""
    script = (f'mount -t tmpfs -o size={SMALL_FILE_SYSTEM} tmpfs "$0" && cd "$0" && {before or "true"} && '
              'dd if=/dev/zero of=fill bs=4k 2>/dev/null; cd / && exec "$@"')
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, str(folder), *command], capture_output=True,
                          text=True, env={**os.environ, **QUICK, **(env or {})}, timeout=600)


def one_line_error(finished: subprocess.CompletedProcess, says: str) -> None:
    lines = [line for line in finished.stderr.splitlines() if line.startswith("mars: error:")]
    assert finished.returncode == 2, finished.stderr[-3000:]
    assert "Traceback" not in finished.stderr and len(lines) == 1 and says in lines[0], finished.stderr[-3000:]


def test_a_full_disk_under_calibrate_keeps_the_earlier_profile(tmp_path, tiny_dir, cache):
    folder = full_file_system(tmp_path)
    old = "earlier: profile\n"
    finished = in_full_file_system(folder, [sys.executable, "-m", "mars_cli.cli", "calibrate", "--target",
                                            str(tiny_dir), "--device", "cpu", "--out", str(folder / "p.yaml"),
                                            "--samples", "50", "--held-out-samples", "10", "--max-new-tokens", "4"],
                                   before=f"printf '{old}' > p.yaml && cat p.yaml > /dev/null")
    one_line_error(finished, "No space left on device")
    assert "p.yaml" in finished.stderr.splitlines()[-1]


def test_a_full_disk_under_eval_is_one_line(tmp_path, tiny_dir, cache):
    folder = full_file_system(tmp_path)
    finished = in_full_file_system(folder, [sys.executable, "-m", "mars_cli.cli", *eval_args(tiny_dir, folder / "run")])
    one_line_error(finished, "No space left on device")


def test_a_full_disk_under_train_head_is_one_line(tmp_path, tiny_dir, cache):
    folder = full_file_system(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"tell me {w} {i}"}) + "\n"
                               for i, w in enumerate(["abc", "dog", "sun", "xyz", "mop"] * 4)))
    finished = in_full_file_system(folder, [sys.executable, "-m", "mars_cli.cli", "train-head", "--target",
                                            str(tiny_dir), "--device", "cpu", "--out", str(folder / "head"),
                                            "--prompts", str(prompts), "-n", "12", "--epochs", "1", "--vocab", "40",
                                            "--batch-size", "4", "--generate-batch", "8"])
    one_line_error(finished, "No space left on device")


def test_a_full_tmpdir_is_passed_over(tmp_path, tiny_dir, cache):
    """Python's tempfile tries TMPDIR, finds it cannot write there and takes the next folder
    (/tmp): the command runs."""
    folder = full_file_system(tmp_path)
    finished = in_full_file_system(folder, [sys.executable, "-m", "mars_cli.cli", *eval_args(tiny_dir, tmp_path / "r")],
                                   env={"TMPDIR": str(folder)})
    assert finished.returncode == 0, finished.stderr[-3000:]


# --------------------------------------------------------------------------- one writer per output
HOLDER = ("import sys, time\nfrom pathlib import Path\nfrom mars_cli.paths import claim_output\n"
          "claim_output(Path(sys.argv[1]), sys.argv[2])\nprint('held', flush=True)\ntime.sleep(600)\n")


def holding(path: Path, command: str) -> subprocess.Popen:
    """Another mars process with `path` claimed, as a running `mars COMMAND --out path` has it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), command], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.parametrize("command", ["eval", "eval --resume", "calibrate", "train-head"])
def test_a_second_writer_of_the_same_output_stops_in_one_line(capsys, tmp_path, tiny_dir, cache, command):
    out = tmp_path / ("run" if command.startswith("eval") else "p.yaml" if command == "calibrate" else "head")
    if command == "eval --resume":
        assert main(eval_args(tiny_dir, out)[:-2] + ["--limit", "1", "--out", str(out)]) == 0
        capsys.readouterr()
    args = {"eval": eval_args(tiny_dir, out), "eval --resume": eval_args(tiny_dir, out, "--resume"),
            "calibrate": calibrate_args(tiny_dir, out),
            "train-head": ["train-head", "--target", str(tiny_dir), "--device", "cpu", "--out", str(out)]}[command]
    before = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    holder = holding(out, command.split()[0])
    try:
        code = main(args)
    finally:
        holder.kill()
        holder.wait()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and err[-1].startswith("mars: error: ")
    assert f"is being written by mars {command.split()[0]} (pid {holder.pid})" in err[-1]
    assert (sorted(p.name for p in out.iterdir()) if out.is_dir() else []) == before  # no file written
    assert main(args[:1] + ["--help"]) == 0  # (the holder is gone:) the claim died with it
    capsys.readouterr()


def test_a_claim_dies_with_its_holder(tmp_path, cache):
    from mars_cli.paths import claim_output, release_outputs

    holder = holding(tmp_path / "run", "eval")
    holder.kill()
    holder.wait()
    claim_output(tmp_path / "run", "eval")  # the kernel dropped the lock with the killed process
    release_outputs()
