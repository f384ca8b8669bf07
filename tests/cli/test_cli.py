"""The CLI through its real entry point: output contract, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mars_cli.cli import main

CONTRACT_STATS = {
    "tokens_per_s", "wall_s", "rounds", "drafted", "accepted", "relaxed", "mean_accepted",
    "acceptance_rate", "per_position_acceptance",
}


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_output_has_contract_keys(capsys, tiny_dir):
    code, out, _ = run_cli(capsys, "generate", "abc abc", "--target", str(tiny_dir), "--json",
                           "--draft", "ngram", "-n", "10", "--device", "cpu")
    assert code == 0
    payload = json.loads(out)
    assert {"text", "new_tokens", "config", "stats"} <= payload.keys()
    assert CONTRACT_STATS <= payload["stats"].keys()
    assert payload["config"]["draft"] == "ngram" and payload["config"]["threshold_source"] == "default"
    assert payload["new_tokens"] == len(payload["token_ids"]) <= 10


def test_streamed_text_equals_json_text(capsys, tiny_dir):
    args = ["generate", "hello there", "--target", str(tiny_dir), "-n", "15", "--device", "cpu"]
    code, streamed, _ = run_cli(capsys, *args)
    assert code == 0
    _, out, _ = run_cli(capsys, *args, "--json")
    assert streamed.rstrip("\n") == json.loads(out)["text"]


def test_same_seed_same_output(capsys, tiny_dir):
    args = ["generate", "seeded", "--target", str(tiny_dir), "-n", "20", "--temperature", "1.0",
            "--top-p", "0.9", "--json", "--device", "cpu"]
    first = json.loads(run_cli(capsys, *args, "--seed", "7")[1])["token_ids"]
    second = json.loads(run_cli(capsys, *args, "--seed", "7")[1])["token_ids"]
    assert first == second


def test_seeded_sampling_is_plain_sampling_whatever_drafts(capsys, tiny_dir):
    """`--seed` fixes what is sampled at each position: strict verification with n-gram drafts, chains
    of any length or the adaptive length emits exactly the tokens `--draft none` samples."""
    args = ["generate", "seeded", "--target", str(tiny_dir), "-n", "24", "--temperature", "0.9", "--top-k", "30",
            "--json", "--device", "cpu", "--seed", "11"]
    plain = json.loads(run_cli(capsys, *args, "--draft", "none")[1])["token_ids"]
    for drafting in (["--draft", "ngram"], ["--draft", "ngram", "-k", "2"], ["--draft", "ngram", "--num-draft", "auto"]):
        assert json.loads(run_cli(capsys, *args, *drafting)[1])["token_ids"] == plain, drafting


def test_stats_table_is_printed(capsys, tiny_dir):
    code, _, err = run_cli(capsys, "generate", "abc", "--target", str(tiny_dir), "-n", "5",
                           "--stats", "--verify", "mars", "--draft", "ngram", "--device", "cpu")
    assert code == 0
    assert "mean accepted" in err and "mars (logit-ratio > 0.900, from default)" in err


def test_prompt_from_stdin(monkeypatch, capsys, tiny_dir):
    import io

    class FakeStdin(io.TextIOWrapper):
        def isatty(self) -> bool:
            return False

    monkeypatch.setattr(sys, "stdin", FakeStdin(io.BytesIO("from stdin".encode())))
    code, out, _ = run_cli(capsys, "generate", "-", "--target", str(tiny_dir), "-n", "4", "--json", "--device", "cpu")
    assert code == 0 and json.loads(out)["config"]["target"] == str(tiny_dir)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "no-such-model"], "unknown model"),
        (["--target", "/nonexistent/model.gguf"], "not found"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--temperature", "-1"], "--temperature"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "1.5"], "--top-p"),
        (["--top-k", "-2"], "--top-k"),
        (["--num-draft", "0"], "--num-draft"),
        (["--threshold", "nan"], "--threshold"),
        (["--threshold", "1.5"], "--threshold"),
        (["--verify", "loose"], "--verify"),
        (["--margin", "entropy"], "--margin"),
        (["--device", "cuda"] if not __import__("torch").cuda.is_available() else ["--device", "tpu"], "device"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tiny_dir, args, message):
    base = ["generate", "hi", "--target", str(tiny_dir)]
    if "--target" in args:
        base = ["generate", "hi"]
    code, out, err = run_cli(capsys, *base, *args)
    assert code == 2
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err and out == ""


def test_empty_prompt_is_refused(capsys, tiny_dir):
    code, _, err = run_cli(capsys, "generate", "   ", "--target", str(tiny_dir))
    assert code == 2 and "empty" in err


def test_unknown_flag_is_usage_error(capsys):
    code, _, err = run_cli(capsys, "generate", "hi", "--no-such-flag")
    assert code == 2 and "No such option" in err


def test_draft_with_other_vocabulary_is_refused(capsys, tiny_dir, tiny_other_vocab_dir):
    code, _, err = run_cli(capsys, "generate", "hi", "--target", str(tiny_dir), "--draft",
                           str(tiny_other_vocab_dir), "--device", "cpu")
    assert code == 2 and "does not share the target's vocabulary" in err


def test_help_documents_every_flag(capsys):
    code, out, _ = run_cli(capsys, "generate", "--help")
    assert code == 0
    for flag in ("--target", "--draft", "--verify", "--threshold", "--margin", "--calibration", "--num-draft",
                 "--max-new-tokens", "--temperature", "--top-p", "--top-k", "--seed", "--device", "--dtype",
                 "--device-map", "--json", "--stats", "--raw", "--stop", "--trust-remote-code"):
        assert flag in out, flag


def test_console_script_runs_as_a_real_process(tiny_dir, tmp_path):
    script = Path(sys.executable).with_name("mars")
    env = dict(os.environ, COLUMNS="120", MARS_CACHE=str(tmp_path))  # measures --dtype auto: not in the user's cache
    done = subprocess.run([str(script), "generate", "hi", "--target", str(tiny_dir), "-n", "3", "--json",
                           "--device", "cpu"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["new_tokens"] <= 3
    bad = subprocess.run([str(script), "generate", "hi", "--top-p", "2"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_options_route_flat_names_to_their_groups():
    from mars_cli.options import DecodingOptions

    options = DecodingOptions.of(target="t", draft="ngram", verify="mars", temperature=0.5, stop=["x"], raw=True)
    assert (options.model.target, options.drafting.draft, options.verification.verify) == ("t", "ngram", "mars")
    assert options.sampling.params.temperature == 0.5 and options.stop == ("x",) and options.raw
    changed = options.replace(draft="none", threshold=0.8)
    assert changed.drafting.draft == "none" and changed.verification.threshold == 0.8
    assert changed.flat() == {**options.flat(), "draft": "none", "threshold": 0.8}
    with pytest.raises(TypeError, match="profile"):
        DecodingOptions.of(profile="old.yaml")


def test_commands_keep_their_own_defaults_and_flags():
    import typer

    from mars_cli.cli import app

    group = typer.main.get_command(app)
    context = typer.Context(group)
    commands = {name: group.get_command(context, name) for name in group.list_commands(context)}
    flags = {name: {p.name: p for p in command.params} for name, command in commands.items()}
    assert [flags[name]["draft"].default for name in ("generate", "profile", "eval")] == ["auto", "ngram", "ngram"]
    assert "verify" not in flags["eval"] and "force" in flags["eval"] and "force" in flags["profile"]
    assert flags["calibrate"]["temperature"].default == 1.0 and "device_map" not in flags["calibrate"]
    assert flags["train-head"]["max_new_tokens"].default == 256 and "num_draft" in flags["train-head"]


def test_stdin_is_read_no_further_than_the_bound(capsys, monkeypatch, tiny_dir):
    """A huge or endless stdin is refused after MAX_PROMPT_BYTES + 1 bytes, in one line, exit 2."""
    import io

    from mars_cli.commands import common

    class Endless(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:
            buffer[:] = b"a" * len(buffer)
            return len(buffer)

    class Stdin:
        buffer = io.BufferedReader(Endless())

        def isatty(self) -> bool:
            return False

    monkeypatch.setattr(common, "MAX_PROMPT_BYTES", 4096)
    monkeypatch.setattr(common.sys, "stdin", Stdin())
    code, out, err = run_cli(capsys, "generate", "-", "--target", str(tiny_dir), "--device", "cpu")
    assert code == 2 and out == "" and err.strip().endswith("no model's context window holds that much")
    assert len(err.strip().splitlines()) == 1


def test_a_prompt_longer_than_the_window_can_hold_is_refused_before_tokenizing(capsys, monkeypatch, tiny_dir):
    from mars_cli import session

    window = 256  # the tiny model's max_position_embeddings
    calls = []
    monkeypatch.setattr(session, "encode_messages", lambda *args: calls.append(args) or [1])
    text = "a" * (window * session.MAX_BYTES_PER_TOKEN + 1)
    code, _, err = run_cli(capsys, "generate", text, "--target", str(tiny_dir), "--device", "cpu", "--draft", "none")
    assert code == 2 and calls == [] and f"more than the model's context window ({window} tokens)" in err
