"""Calibration estimators, the profile schema, lookup order and the end-to-end command."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from mars_cli.calibration import objectives as cal
from mars_cli.calibration import profiles as calibration_profiles
from mars_cli.calibration.collection import MarginSample, TopTwoRecorder
from mars_cli.calibration.fitting import bootstrap_interval
from mars_cli.calibration.run import BUILTIN_PROMPTS
from mars_cli.cli import main
from mars_cli.errors import UserError
from mars_cli.prompts import load_prompts


# ----------------------------------------------------------------------------- estimators
def test_rate_objective_recovers_known_quantile():
    margins = torch.linspace(0, 1, 10001)[1:]  # uniform: share(m > t) = 1 - t
    for rate in (0.05, 0.2, 0.5):
        theta = cal.threshold_for_rate(margins, rate)
        assert theta == pytest.approx(1 - rate, abs=2e-4)
        assert int((margins > theta).sum()) <= rate * margins.numel()


def test_loss_objective_with_constant_gap_is_a_rate():
    margins = torch.linspace(0, 1, 10001)[1:]
    gaps = torch.full_like(margins, 2.0)  # every eligible position costs 2 nats
    theta = cal.threshold_for_loss(margins, gaps, 0.1)  # so at most 5% may be eligible
    assert theta == pytest.approx(0.95, abs=2e-4)
    assert cal.measured(margins, gaps, theta)["loss"] <= 0.1


def test_loss_objective_prefers_cheap_positions_first():
    margins = torch.tensor([0.99, 0.98, 0.97, 0.5])
    gaps = torch.tensor([0.01, 0.02, 4.0, 0.0])
    theta = cal.threshold_for_loss(margins, gaps, 0.01)
    assert cal.measured(margins, gaps, theta) == {"rate": 0.5, "loss": pytest.approx(0.0075)}


def test_never_eligible_margins_clamp_into_range():
    margins = torch.full((10,), float("-inf"))
    assert cal.threshold_for_rate(margins, 0.5) == 1e-6


@pytest.mark.parametrize("text", ["rate=0", "rate=1.2", "loss=-1", "loss=abc", "speed=2", "rate"])
def test_bad_objective_is_refused(text):
    with pytest.raises(UserError, match="--objective"):
        cal.parse_objective(text)


def test_prob_ratio_threshold_follows_temperature():
    assert calibration_profiles.threshold_at_temperature(0.5, "prob-ratio", 0.5) == pytest.approx(0.25)
    assert calibration_profiles.threshold_at_temperature(0.5, "prob-ratio", 0.0) == 0.5
    assert calibration_profiles.threshold_at_temperature(0.93, "logit-ratio", 0.7) == 0.93


def test_top_two_recorder_keeps_every_emitted_position_in_order():
    recorder = TopTwoRecorder()
    assert [t.numel() for t in recorder.values()] == [0, 0]
    recorder(torch.tensor([[1.0, 3.0, 2.0], [5.0, 5.0, 0.0]]))
    recorder(torch.tensor([[0.5, -1.0, 0.25]]))
    z1, z2 = recorder.values()
    assert z1.tolist() == [3.0, 5.0, 0.5] and z2.tolist() == [2.0, 5.0, 0.25]


def test_bootstrap_interval_brackets_the_estimate():
    torch.manual_seed(0)
    sample = MarginSample()
    for _ in range(12):
        z1 = torch.rand(50) * 5 + 5
        sample.add(z1, z1 - torch.rand(50) * 2)
    groups = list(range(12))
    z1, z2 = sample.positions()
    theta = cal.fit(z2 / z1, z1 - z2, cal.Objective("rate", 0.3))
    low, high = bootstrap_interval(sample, groups, "logit-ratio", cal.Objective("rate", 0.3))
    assert low <= theta <= high and high - low < 0.1


def test_prompt_file_errors_name_the_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\nnot json\n')
    with pytest.raises(UserError, match="line 3"):
        load_prompts(path, BUILTIN_PROMPTS)
    path.write_text('{"prompt": "only one"}\n')
    with pytest.raises(UserError, match="at least 2"):
        load_prompts(path, BUILTIN_PROMPTS)


# ----------------------------------------------------------------------------- profiles
def sample_profile(fingerprint: str = "f" * 64) -> dict:
    return {
        "schema": 1,
        "model": {"name": "m", "source": "/x", "fingerprint": fingerprint, "vocab_size": 10},
        "thresholds": {"logit-ratio": 0.93, "prob-ratio": 0.4},
        "temperature": 1.0,
        "objective": {"kind": "loss", "value": 0.05},
        "samples": 100,
        "prompt_set": {"name": "builtin", "sha256": "0" * 64},
        "quantiles": {"logit-ratio": {"0.5": 0.9}},
        "tool_version": "0.1.0",
        "created": "2026-11-29T00:00:00Z",
        "command": "mars calibrate",
    }


def test_profile_round_trip(tmp_path):
    path = calibration_profiles.save(sample_profile(), tmp_path / "p.yaml")
    loaded = calibration_profiles.load(path)
    assert loaded.data == sample_profile()
    assert loaded.threshold("logit-ratio") == 0.93
    assert not list(tmp_path.glob("*.tmp")), "temporary file left behind"


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("thresholds"), "missing field 'thresholds'"),
        (lambda d: d["thresholds"].update({"logit-ratio": 1.5}), "(0, 1]"),
        (lambda d: d["thresholds"].update({"logit-ratio": float("nan")}), "(0, 1]"),
        (lambda d: d["thresholds"].update({"prob-ratio": -0.1}), "(0, 1]"),
        (lambda d: d["thresholds"].update({"entropy": 0.5}), "unknown margin measure"),
        (lambda d: d.update({"schema": 99}), "schema version 99"),
        (lambda d: d["model"].pop("fingerprint"), "model.fingerprint"),
        (lambda d: d.update({"samples": "many"}), "wrong type"),
    ],
)
def test_malformed_profiles_are_refused(tmp_path, mutate, message):
    data = sample_profile()
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        calibration_profiles.load(path)


def test_unsafe_or_broken_yaml_is_refused(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(UserError, match="not valid YAML"):
        calibration_profiles.load(path)
    path.write_text("schema: [1,\n")
    with pytest.raises(UserError, match="line"):
        calibration_profiles.load(path)
    with pytest.raises(UserError, match="not found"):
        calibration_profiles.load(tmp_path / "missing.yaml")


def test_profile_for_another_model_needs_force(tmp_path):
    profile = calibration_profiles.load(calibration_profiles.save(sample_profile("a" * 64), tmp_path / "p.yaml"))
    with pytest.raises(UserError, match="--force"):
        calibration_profiles.check_matches(profile, "b" * 64, "other", force=False)
    calibration_profiles.check_matches(profile, "b" * 64, "other", force=True)


def test_lookup_prefers_user_directory(tmp_path, monkeypatch):
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    monkeypatch.setenv("MARS_PROFILES", str(user))
    monkeypatch.setattr(calibration_profiles, "SHIPPED_DIR", shipped)
    calibration_profiles.save(sample_profile("c" * 64), shipped / "c.yaml")
    assert calibration_profiles.find_for("c" * 64).path == shipped / "c.yaml"
    user_data = sample_profile("c" * 64)
    user_data["thresholds"]["logit-ratio"] = 0.97
    calibration_profiles.save(user_data, user / "mine.yaml")
    (user / "broken.yaml").write_text("::: not yaml :::\n")
    found = calibration_profiles.find_for("c" * 64)
    assert found.path == user / "mine.yaml" and found.threshold("logit-ratio") == 0.97
    assert calibration_profiles.find_for("d" * 64) is None


# ----------------------------------------------------------------------------- end to end
def test_calibrate_then_generate_picks_up_the_profile(capsys, tmp_path, monkeypatch, tiny_dir):
    user = tmp_path / "profiles"
    monkeypatch.setenv("MARS_PROFILES", str(user))
    out = user / "tiny.yaml"
    code = main(["calibrate", "--target", str(tiny_dir), "--samples", "120", "-n", "12", "--seed", "3",
                 "--objective", "rate=0.25", "--out", str(out), "--device", "cpu", "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    profile = calibration_profiles.load(out)
    assert printed["thresholds"] == profile.data["thresholds"]
    assert profile.data["samples"] == 120 and profile.data["objective"] == {"kind": "rate", "value": 0.25}
    assert "--seed 3" in profile.data["command"]
    assert 0 < profile.threshold("logit-ratio") <= 1
    # the same command reproduces the same thresholds
    again = tmp_path / "again.yaml"
    main(["calibrate", "--target", str(tiny_dir), "--samples", "120", "-n", "12", "--seed", "3",
          "--objective", "rate=0.25", "--out", str(again), "--device", "cpu", "--json"])
    capsys.readouterr()
    assert calibration_profiles.load(again).data["thresholds"] == profile.data["thresholds"]

    code = main(["generate", "abc", "--target", str(tiny_dir), "--verify", "mars", "-n", "5", "--json",
                 "--device", "cpu"])
    config = json.loads(capsys.readouterr().out)["config"]
    assert code == 0 and config["threshold_source"] in (str(out), str(again))
    greedy = profile.data["modes"]["greedy"]  # greedy decoding takes the thresholds fitted on greedy paths
    assert greedy["temperature"] == 0 and greedy["positions"] > 0
    assert config["threshold"] == pytest.approx(greedy["thresholds"]["logit-ratio"])
    code = main(["generate", "abc", "--target", str(tiny_dir), "--verify", "mars", "-n", "5", "--json",
                 "--device", "cpu", "--temperature", "1", "--seed", "1"])
    config = json.loads(capsys.readouterr().out)["config"]  # sampling: the sampled mode, as at the top level
    assert code == 0 and config["threshold"] == pytest.approx(profile.threshold("logit-ratio"))
    assert profile.data["modes"]["sampled"]["thresholds"] == profile.data["thresholds"]
    # an explicit flag wins over the profile
    main(["generate", "abc", "--target", str(tiny_dir), "--verify", "mars", "--threshold", "0.5", "-n", "3",
          "--json", "--device", "cpu"])
    config = json.loads(capsys.readouterr().out)["config"]
    assert config["threshold"] == 0.5 and config["threshold_source"] == "flag"


def test_profile_for_another_model_is_refused_by_generate(capsys, tmp_path, tiny_dir):
    path = calibration_profiles.save(sample_profile("e" * 64), tmp_path / "other.yaml")
    code = main(["generate", "abc", "--target", str(tiny_dir), "--verify", "mars", "--calibration", str(path),
                 "-n", "3", "--device", "cpu"])
    assert code == 2 and "--force" in capsys.readouterr().err
    code = main(["generate", "abc", "--target", str(tiny_dir), "--verify", "mars", "--calibration", str(path),
                 "--force", "-n", "3", "--device", "cpu", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["config"]["threshold"] == 0.93


@pytest.mark.parametrize("command", ["profile", "eval"])
def test_force_lets_profile_and_eval_use_a_profile_for_another_model(capsys, tmp_path, tiny_dir, command):
    path = calibration_profiles.save(sample_profile("e" * 64), tmp_path / "other.yaml")
    suite = tmp_path / "one.jsonl"
    suite.write_text('{"prompt": "abc abc"}\n')
    own = {"profile": ["profile", "abc abc", "--verify", "mars"],
           "eval": ["eval", "--suite", str(suite), "--limit", "1", "--methods", "mars"]}[command]
    args = [*own, "--target", str(tiny_dir), "--calibration", str(path), "-n", "2", "--device", "cpu", "--json"]
    assert main(args) == 2 and "--force" in capsys.readouterr().err
    code = main([*args, "--force"])
    result = json.loads(capsys.readouterr().out)
    used = result["margins"] if command == "profile" else result["methods"]["mars"]
    assert code == 0 and used["threshold"] == 0.93


def test_generate_has_no_profile_flag(capsys):
    """--calibration was briefly spelled --profile before 0.1.0; that name is gone (`mars profile`
    is a command), so it is an unknown option."""
    assert main(["generate", "abc", "--profile", "p.yaml"]) == 2
    assert "--profile" in capsys.readouterr().err
    assert main(["generate", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "--calibration" in shown and "--profile" not in shown


def test_calibrate_refuses_unwritable_out_before_sampling(capsys, tmp_path, tiny_dir):
    code = main(["calibrate", "--target", str(tiny_dir), "--out", str(tmp_path), "--device", "cpu"])
    assert code == 2 and "directory" in capsys.readouterr().err


@pytest.mark.embedded
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_shipped_profile_loads_and_is_used(capsys, name):
    from mars_cli.models import load_model

    shipped = calibration_profiles.SHIPPED_DIR / f"{name}.yaml"
    profile = calibration_profiles.load(shipped)
    assert profile.fingerprint == load_model(name, device="cpu").fingerprint
    code = main(["generate", "What is 2+2?", "--target", name, "--verify", "mars", "--draft", "ngram", "-n", "8",
                 "--json"])
    config = json.loads(capsys.readouterr().out)["config"]
    assert code == 0 and config["threshold_source"] == str(shipped)
    greedy = profile.mode_for(0.0)  # generate decodes greedily: the greedy mode's threshold
    assert greedy.name == "greedy" and config["threshold"] == pytest.approx(greedy.block["thresholds"]["logit-ratio"])


def test_mismatch_with_the_same_model_name_says_the_weights_differ(tmp_path):
    from mars_cli.calibration.profiles import Profile, check_matches

    profile = Profile(tmp_path / "p.yaml", {"model": {"name": "smollm2-135m", "fingerprint": "a" * 64}})
    with pytest.raises(UserError) as caught:
        check_matches(profile, "b" * 64, "smollm2-135m", force=False)
    message = str(caught.value)
    assert "calibrated for a different 'smollm2-135m'" in message and "other weights" in message
    assert "not for 'smollm2-135m'" not in message and "aaaaaaaaaaaa" in message and "bbbbbbbbbbbb" in message
    with pytest.raises(UserError, match="calibrated for 'smollm2-135m', not for 'gemma3-270m'"):
        check_matches(profile, "b" * 64, "gemma3-270m", force=False)
    check_matches(profile, "b" * 64, "smollm2-135m", force=True)


def test_atomically_written_files_keep_the_usual_mode(tmp_path):
    """write_atomic (profiles, results, partial files) gives what `open(path, "w")` would: 0666
    less the umask for a new file, the old mode for a replaced one; never mkstemp's 0600."""
    import os
    import stat

    from mars_cli.paths import write_atomic

    old = os.umask(0o022)
    try:
        path = calibration_profiles.save(sample_profile(), tmp_path / "p.yaml")
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        os.chmod(path, 0o640)
        write_atomic(path, "again")
        assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.read_text() == "again"
        os.umask(0o077)
        write_atomic(tmp_path / "private.json", "{}")
        assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600
    finally:
        os.umask(old)
