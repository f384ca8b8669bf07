"""Issue 18: thresholds per decoding mode, and the measured-quality objective (quality=DROP):
sweep selection, bootstrap, mode lookup and its fallback note, profiles with a sweep, old
profiles, bad input, and a small end-to-end calibration on the tiny models."""

from __future__ import annotations

import copy
import json
import math
import statistics

from pathlib import Path

import pytest

from mars_cli import notes
import yaml

from mars_cli.calibration import decision as deciding
from mars_cli.calibration import profiles as calibration_profiles
from mars_cli.calibration import sweep as sweeping
from mars_cli.calibration.profiles import Profile, mode_of, to_raw
from mars_cli.cli import main
from mars_cli.errors import UserError


# ----------------------------------------------------------------------------- selection
def test_monotone_table_picks_the_last_theta_within_the_drop():
    table = {0.97: {"m": 0.0, "lp": 0.001}, 0.94: {"m": 0.005, "lp": 0.01}, 0.90: {"m": 0.019, "lp": 0.015},
             0.85: {"m": 0.03, "lp": 0.02}, 0.80: {"m": 0.08, "lp": 0.05}}
    assert deciding.select(table, 0.02) == 0.90
    assert deciding.select(table, 0.05) == 0.85 and deciding.select(table, 0.1) == 0.80  # all hold: the lowest
    assert deciding.select(table, 0.0005) is None  # even the strictest fails


def test_noisy_table_never_picks_a_pass_below_a_failure():
    # 0.90 fails (noise or not); 0.85 and 0.80 happen to pass: they are not chosen
    table = {0.97: {"m": 0.0}, 0.94: {"m": -0.01}, 0.90: {"m": 0.04}, 0.85: {"m": 0.0}, 0.80: {"m": -0.02}}
    assert deciding.select(table, 0.02) == 0.94
    # one metric failing is enough, whatever the others say
    table[0.94]["lp"] = 0.5
    assert deciding.select(table, 0.02) == 0.97


def test_relaxing_further_for_no_more_speed_is_not_chosen():
    # every theta holds quality; tau stops rising at 0.90 (the 2026-12-04 greedy sweep's shape)
    table = {0.97: {"m": 0.0}, 0.94: {"m": 0.0}, 0.90: {"m": 0.01}, 0.85: {"m": 0.01}, 0.80: {"m": 0.01}}
    taus = {0.97: 2.50, 0.94: 2.97, 0.90: 3.03, 0.85: 3.03, 0.80: 3.031}
    assert deciding.select(table, 0.02) == 0.80  # without taus: the most permissive that holds
    assert deciding.select(table, 0.02, taus) == 0.90  # the strictest within 1% of the best tau
    taus[0.80] = 3.2  # speed still rising: the most permissive again
    assert deciding.select(table, 0.02, taus) == 0.80
    # a failing theta still ends the walk, whatever its tau
    table[0.85]["m"] = 0.05
    assert deciding.select(table, 0.02, taus) == 0.90
    assert deciding.select({0.97: {"m": 0.5}}, 0.02, {0.97: 9.0}) is None


def test_relative_drop_is_a_share_of_strict_and_higher_is_better():
    assert deciding.relative_drop(0.5, 0.49) == pytest.approx(0.02)
    assert deciding.relative_drop(-0.40, -0.41) == pytest.approx(0.025)  # log-probability: lower is worse
    assert deciding.relative_drop(-0.40, -0.38) < 0  # better than strict
    assert deciding.relative_drop(0.0, 0.0) == 0.0 and deciding.relative_drop(0.0, 0.3) == 0.0
    assert deciding.relative_drop(0.0, -1.0) == math.inf


def record(metric, score, tokens=10, logprob=-4.0, rounds=5, accepted=5, relaxed=0):
    """A sample record as `mars eval` writes it (the sweep's records are eval's), with the metric named."""
    return {"suite": metric.partition(":")[0], "sample_id": "x", "method": "m", "metric": metric,
            "new_tokens": tokens, "sum_logprob": logprob, "rounds": rounds, "drafted": accepted,
            "accepted": accepted, "relaxed": relaxed, "drafted_at": [], "accepted_at": [], "token_ids": [],
            "accepted_per_round": {}, "wall_s": 1.0, "rss_mb": 1.0, "task_score": score}


def synthetic_run(scores_by_theta, strict_scores):
    """Records for two suites; each theta's scores per sample, strict's as the reference."""
    reference = [record("a:m", s) for s in strict_scores]
    runs = {theta: [record("a:m", s, rounds=4, relaxed=1) for s in scores] for theta, scores in scores_by_theta.items()}
    return reference, runs


def test_summary_pools_tokens_and_averages_each_metric():
    records = [record("a:m", 1.0, tokens=10, logprob=-5, rounds=5), record("b:n", None, tokens=30, logprob=-3, rounds=10),
               record("b:n", 0.5, tokens=20, logprob=-2, rounds=5, accepted=10, relaxed=2)]
    summary = deciding.summarise(records, range(3))
    assert summary["tau"] == pytest.approx(60 / 20) and summary["mean_logprob"] == pytest.approx(-10 / 60)
    assert summary["a:m"] == 1.0 and summary["b:n"] == 0.5  # a sample without a score does not count
    assert summary["relaxed_share"] == pytest.approx(2 / 20)


def paired_run(scores_by_theta, strict_scores, rounds_by_theta=None):
    """Records of one suite, each sample with its own id (the runs pair by it); a theta's rounds
    (4 unless given) set its tau."""
    reference = [dict(record("a:m", s), sample_id=f"s{i}") for i, s in enumerate(strict_scores)]
    runs = {theta: [dict(record("a:m", s, rounds=(rounds_by_theta or {}).get(theta, 4), relaxed=1), sample_id=f"s{i}")
                    for i, s in enumerate(scores)] for theta, scores in scores_by_theta.items()}
    return reference, runs


def test_paired_intervals_decide_clear_pass_clear_fail_and_unclear():
    strict = [1.0, 0.0] * 6
    reference, runs = paired_run({
        0.97: list(strict),  # the same scores: drop 0, interval [0, 0]
        0.94: [0.0, 1.0] * 6,  # the same mean, every sample changed: point drop 0, a wide interval
        0.90: [0.0] * 12,  # every answer lost
    }, strict)
    table = deciding.assess(reference, runs, 0.1)
    same, swapped, lost = table[0.97]["a:m"], table[0.94]["a:m"], table[0.90]["a:m"]
    assert (same.estimate, same.low, same.high, same.decision) == (0.0, 0.0, 0.0, "pass")
    assert swapped.estimate == 0.0 and swapped.low < 0 and swapped.high > 0.1 and swapped.decision == "unclear"
    assert lost.estimate == 1.0 and lost.low > 0.1 and lost.decision == "fail"
    assert {theta: deciding.theta_decision(row) for theta, row in table.items()} == \
        {0.97: "pass", 0.94: "unclear", 0.90: "fail"}
    # the point estimates alone would pass 0.94; the interval does not
    assert deciding.select({theta: {"a:m": row["a:m"].estimate} for theta, row in table.items()}, 0.1) == 0.94
    decision = deciding.decide(table, {0.97: 2.0, 0.94: 2.5, 0.90: 3.0})
    assert (decision.chosen, decision.stopped, decision.clear, decision.if_unclear_passed) == (0.97, 0.94, False, 0.94)
    # the rule's edges: the upper end at DROP passes, the lower end at DROP is not yet a failure
    assert deciding.judge(0.0, 0.1, 0.1) == "pass" and deciding.judge(0.1, 0.3, 0.1) == "unclear"
    assert deciding.judge(0.11, 0.3, 0.1) == "fail"


def test_the_walk_stops_at_a_clear_failure_and_the_decision_is_then_clear():
    strict = [1.0] * 12
    reference, runs = paired_run({0.97: strict, 0.94: [1.0] * 11 + [0.0], 0.90: [0.0] * 12}, strict,
                                 {0.97: 4, 0.94: 3, 0.90: 2})
    block = sweeping.sweep_block(sweeping.ModeRun(reference, runs, [[]] * 12, [[]] * 12), 0.3, "logit-ratio", seed=0)
    decisions = {row["theta"]: row["decision"] for row in block["rows"]}
    assert decisions == {0.97: "pass", 0.94: "pass", 0.90: "fail"}
    assert block["chosen"] == 0.94 and block["decision"] == "clear" and block["chosen_if_unclear_passed"] == 0.94
    row = next(row for row in block["rows"] if row["theta"] == 0.94)["metrics"]["a:m"]
    assert row["drop"] == pytest.approx(1 / 12, abs=1e-6) and row["drop_interval_95"][0] == 0.0
    assert row["drop_interval_95"][1] <= 0.3 and row["decision"] == "pass"
    # the same records decide the same way every time (the bootstrap's generator is seeded)
    assert sweeping.sweep_block(sweeping.ModeRun(reference, runs, [[]] * 12, [[]] * 12), 0.3, "logit-ratio",
                                seed=0) == block


def test_the_power_estimate_follows_the_normal_approximation():
    # strict scores 1 everywhere, so each sample's paired difference is its own loss
    mars = [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # drop 1/6
    reference, runs = paired_run({0.9: mars}, [1.0] * 12)
    columns = deciding.paired_columns(reference, runs[0.9], "a:m")
    sd = statistics.stdev(mars)
    assert deciding.paired_sd(columns) == pytest.approx(sd, rel=1e-6)
    margin = 0.25 - 1 / 6
    expected = math.ceil((1.96 * sd / margin) ** 2)
    assert expected == 84  # sd 0.389: (1.96 * 0.389 / 0.0833) ** 2 = 83.8
    assert deciding.samples_needed(sd, margin) == expected
    block = sweeping.sweep_block(sweeping.ModeRun(reference, runs, [[]] * 12, [[]] * 12), 0.25, "logit-ratio", seed=0)
    assert block["decision"] == "unclear" and block["chosen"] is None
    assert block["samples_needed"] == [{"theta": 0.9, "outcome": "pass", "samples": expected}]
    # a drop beyond DROP needs a clear fail; one on the line itself has no estimate
    assert deciding.samples_needed(sd, 0.0) is None and deciding.samples_needed(0.0, 0.1) == 2
    # with strict varying too, a sample's paired difference is (strict_i - mars_i) / strict (no mean drop)
    strict, shifted = [1.0, 0.5, 0.0, 1.0, 0.5, 0.0], [0.5, 1.0, 0.0, 0.5, 1.0, 0.0]
    columns = deciding.paired_columns(*_pair(strict, shifted), "a:m")
    differences = [(s - m) / 0.5 for s, m in zip(strict, shifted)]
    assert deciding.paired_sd(columns) == pytest.approx(statistics.stdev(differences), rel=1e-6)


def _pair(strict, mars):
    reference, runs = paired_run({0.9: mars}, strict)
    return reference, runs[0.9]


def test_next_limit_doubles_within_the_budget():
    assert sweeping.next_limit(4, [30, 30], elapsed=10.0, decoded=8) == 8
    assert sweeping.next_limit(4, [6, 30], elapsed=10.0, decoded=8) == 8  # a short suite gives what it has
    assert sweeping.next_limit(8, [6, 6], elapsed=10.0, decoded=12) is None  # every suite exhausted
    assert sweeping.next_limit(16, [40], elapsed=10.0, decoded=16) == 32
    assert sweeping.next_limit(32, [40], elapsed=10.0, decoded=32) is None  # AUTO_MAX
    assert sweeping.next_limit(4, [40], elapsed=10.0, decoded=4, most=6) == 6
    # 100 s for 8 samples: 8 more would take 100 s, past a 150 s budget
    assert sweeping.next_limit(4, [20, 20], elapsed=100.0, decoded=8, seconds=150.0) is None
    assert sweeping.next_limit(4, [20, 20], elapsed=100.0, decoded=8, seconds=200.0) == 8


def test_merged_rounds_keep_each_suite_in_its_own_order():
    def run(ids):
        records = [dict(record(f"{suite}:m", 1.0), suite=suite, sample_id=sample) for suite, sample in ids]
        return sweeping.ModeRun(records, {0.9: [dict(r) for r in records]}, [[float(i)] for i in range(len(ids))],
                                [[0.0]] * len(ids))

    first = run([("a", "a3"), ("b", "b3")])  # the last sample of each suite
    second = run([("a", "a1"), ("a", "a2"), ("b", "b2")])  # further back (b has 3 samples)
    merged = sweeping.merge([([1, 1], first), ([2, 1], second)])
    order = [(r["suite"], r["sample_id"]) for r in merged.reference]
    assert order == [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b2"), ("b", "b3")]
    assert [(r["suite"], r["sample_id"]) for r in merged.runs[0.9]] == order
    assert merged.z1 == [[0.0], [1.0], [0.0], [2.0], [1.0]]


@pytest.mark.parametrize("text, expected", [("auto", "auto"), ("AUTO", "auto"), ("7", 7), (3, 3)])
def test_limit_parses_numbers_and_auto(text, expected):
    assert sweeping.parse_limit(text) == expected


def test_sweep_block_records_the_evidence():
    reference, runs = synthetic_run({0.95: [1.0] * 4, 0.9: [1.0, 1.0, 1.0, 0.0]}, [1.0] * 4)
    run = sweeping.ModeRun(reference, runs, [[]] * 4, [[]] * 4)
    block = sweeping.sweep_block(run, 0.1, "logit-ratio", seed=0)
    assert block["chosen"] == 0.95 and [row["theta"] for row in block["rows"]] == [0.9, 0.95]
    row = block["rows"][0]
    assert row["tau"] == 2.5 and row["relaxed_share"] == 0.2 and row["decision"] == "unclear"
    assert row["metrics"]["a:m"]["value"] == 0.75 and row["metrics"]["a:m"]["drop"] == 0.25
    low, high = row["metrics"]["a:m"]["drop_interval_95"]
    assert low <= 0.1 < 0.25 <= high and row["metrics"]["a:m"]["decision"] == "unclear"
    assert set(row["metrics"]) == {"a:m", "mean_logprob"}
    assert block["strict"]["tau"] == 2.0 and block["samples"] == block["samples_per_suite"] == 4
    assert block["decision"] == "unclear" and block["level"] == 0.95
    assert [entry["theta"] for entry in block["samples_needed"]] == [0.95, 0.9]


@pytest.mark.parametrize("text", ["0.8,1.5", "0,0.5", "a,b", ","])
def test_bad_thetas_are_refused(text):
    with pytest.raises(UserError, match="--thetas"):
        sweeping.parse_thetas(text)


def test_prob_ratio_thresholds_go_back_to_the_raw_scale():
    theta = to_raw(0.5, "prob-ratio", 0.5)
    assert calibration_profiles.threshold_at_temperature(theta, "prob-ratio", 0.5) == pytest.approx(0.5)
    assert to_raw(0.9, "logit-ratio", 0.5) == 0.9 and to_raw(0.5, "prob-ratio", 0.0) == 0.5


# ----------------------------------------------------------------------------- profiles with modes
def two_mode_profile(fingerprint: str = "f" * 64, modes=("greedy", "sampled")) -> dict:
    blocks = {
        "greedy": {"temperature": 0.0, "thresholds": {"logit-ratio": 0.9}, "objective": {"kind": "quality", "value": 0.02},
                   "positions": 100,
                   "sweep": {"measure": "logit-ratio", "samples": 4, "chosen": 0.9, "chosen_interval_90": [0.85, 0.94],
                             "strict": {"tau": 1.5, "relaxed_share": 0.0, "mean_logprob": -0.4, "math:exact_number": 0.5},
                             "rows": [{"theta": 0.9, "tau": 1.8, "relaxed_share": 0.12,
                                       "metrics": {"mean_logprob": {"value": -0.404, "drop": 0.01,
                                                                    "drop_interval_90": [0.0, 0.02]}}}]}},
        "sampled": {"temperature": 1.0, "thresholds": {"logit-ratio": 0.95, "prob-ratio": 0.5},
                    "objective": {"kind": "quality", "value": 0.02}, "positions": 100},
    }
    primary = blocks["sampled"] if "sampled" in modes else blocks["greedy"]
    return {
        "schema": 2,
        "model": {"name": "m", "source": "/x", "fingerprint": fingerprint, "vocab_size": 10},
        "thresholds": dict(primary["thresholds"]),
        "temperature": primary["temperature"],
        "objective": {"kind": "quality", "value": 0.02},
        "samples": 100,
        "prompt_set": {"name": "math", "sha256": "0" * 64},
        "quantiles": {},
        "modes": {mode: blocks[mode] for mode in modes},
        "tool_version": "0.1.0",
        "created": "2026-11-29T00:00:00Z",
        "command": "mars calibrate --objective quality=0.02",
    }


def test_profile_with_modes_and_sweep_round_trips(tmp_path):
    data = two_mode_profile()
    path = calibration_profiles.save(copy.deepcopy(data), tmp_path / "p.yaml")
    loaded = calibration_profiles.load(path)
    assert loaded.data == data
    assert loaded.modes()["greedy"]["sweep"]["rows"][0]["metrics"]["mean_logprob"]["drop_interval_90"] == [0.0, 0.02]
    assert "!!python" not in path.read_text()  # plain safe YAML


def test_mode_lookup_follows_the_temperature():
    profile = Profile(None, two_mode_profile())
    assert mode_of(0) == "greedy" and mode_of(0.7) == "sampled"
    greedy, sampled = profile.mode_for(0.0), profile.mode_for(0.7)
    assert (greedy.name, greedy.note, greedy.block["thresholds"]["logit-ratio"]) == ("greedy", None, 0.9)
    assert (sampled.name, sampled.note, sampled.block["thresholds"]["logit-ratio"]) == ("sampled", None, 0.95)
    only_greedy = Profile(None, two_mode_profile(modes=("greedy",)))
    fallback = only_greedy.mode_for(1.0)
    assert fallback.name == "greedy" and "no thresholds for sampling" in fallback.note


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["modes"].update({"beam": d["modes"]["greedy"]}), "unknown mode 'beam'"),
    (lambda d: d["modes"]["greedy"].update({"temperature": 1.0}), "mode greedy needs a temperature of 0"),
    (lambda d: d["modes"]["sampled"].update({"temperature": 0}), "mode sampled needs a temperature > 0"),
    (lambda d: d["modes"]["sampled"]["thresholds"].update({"logit-ratio": 1.5}), "(mode sampled) must be a number"),
    (lambda d: d["modes"]["greedy"]["sweep"]["rows"][0].update({"theta": "high"}), "sweep of mode greedy"),
    (lambda d: d.update({"modes": []}), "field 'modes'"),
])
def test_malformed_modes_are_refused(tmp_path, mutate, message):
    data = two_mode_profile()
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        calibration_profiles.load(path)


OLD_PROFILES = sorted((Path(__file__).parents[1] / "data").glob("schema1-*.yaml"))  # as shipped before modes


@pytest.mark.parametrize("shipped", OLD_PROFILES, ids=lambda p: p.name)
def test_old_profile_files_load_as_sampled_at_their_temperature(shipped):
    profile = calibration_profiles.load(shipped)
    assert profile.data["schema"] == 1 and "modes" not in profile.data
    assert list(profile.modes()) == ["sampled"] and profile.data["temperature"] == 1.0
    sampled = profile.mode_for(1.0)
    assert sampled.note is None and sampled.block["thresholds"] == profile.data["thresholds"]
    greedy = profile.mode_for(0.0)  # no greedy thresholds: the sampled ones, said out loud
    assert greedy.name == "sampled" and "no thresholds for greedy" in greedy.note
    assert greedy.block["thresholds"]["logit-ratio"] == profile.threshold("logit-ratio")


def test_decoding_falls_back_with_one_note(capsys, tmp_path, tiny_dir, monkeypatch):
    monkeypatch.setattr(notes, "_SHOWN", set())
    path = calibration_profiles.save(two_mode_profile(modes=("greedy",)), tmp_path / "greedy-only.yaml")
    args = ["generate", "abc", "--target", str(tiny_dir), "--verify", "mars", "--calibration", str(path), "--force",
            "-n", "3", "--device", "cpu", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["config"]["threshold"] == 0.9  # greedy: its own thresholds, no fallback note
    assert "no thresholds for" not in captured.err  # (a first use may note its cost measurement)
    assert main([*args, "--temperature", "1", "--seed", "0"]) == 0
    captured = capsys.readouterr()
    shown = [line for line in captured.err.splitlines() if "no thresholds for sampling" in line]
    assert len(shown) == 1 and shown[0].startswith("mars: note: profile ") and str(path) in shown[0]
    assert json.loads(captured.out)["config"]["threshold"] == 0.9


def test_a_profile_that_relaxes_nothing_says_so(capsys, tmp_path, tiny_dir, monkeypatch):
    """A quality fit where no theta held (theta 1): MARS then verifies strictly, and says why."""
    monkeypatch.setattr(notes, "_SHOWN", set())
    data = two_mode_profile()
    data["modes"]["greedy"]["thresholds"]["logit-ratio"] = 1.0
    path = calibration_profiles.save(data, tmp_path / "strict-greedy.yaml")
    args = ["generate", "abc", "--target", str(tiny_dir), "--verify", "mars", "--calibration", str(path), "--force",
            "-n", "3", "--device", "cpu", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    shown = [line for line in captured.err.splitlines() if "relaxing (theta 1)" in line]
    assert len(shown) == 1 and "greedy fit" in shown[0] and "strict-greedy.yaml" in shown[0]
    assert json.loads(captured.out)["config"]["threshold"] == 1.0
    assert main([*args, "--temperature", "1", "--seed", "0"]) == 0  # the sampled fit relaxes: no such note
    assert "relaxing (theta 1)" not in capsys.readouterr().err


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("args, expected", [
    (["--objective", "quality=0"], "(0, 1)"),
    (["--objective", "quality=1"], "(0, 1)"),
    (["--objective", "quality=-0.1"], "(0, 1)"),
    (["--objective", "quality=x"], "quality=DROP"),
    (["--objective", "quality=0.05", "--suite", "chat"], "suites with them: code, math, summarize, translate"),
    (["--objective", "quality=0.05", "--suite", "code"], "--allow-code-execution"),
    (["--objective", "quality=0.05", "--thetas", "0.5,2"], "--thetas"),
    (["--objective", "quality=0.05", "--limit", "0"], "--limit"),
    (["--objective", "quality=0.05", "--limit", "bogus"], "--limit 'bogus': expected a number of samples a suite"),
    (["--limit", "-3"], "--limit must be at least 1 (or auto)"),
    (["--objective", "quality=0.05", "--resume"], "starts afresh"),
    (["--objective", "quality=0.05", "--draft", "none"], "needs a drafter"),
    (["--modes", "beam"], "--modes"),
    (["--temperature", "0"], "--temperature 0"),
    (["--plot", "x.png"], "--plot draws a quality= sweep"),
    (["--replot", "p.yaml"], "give both"),
])
def test_bad_calibrate_input_is_one_line_and_exit_2(capsys, tmp_path, tiny_dir, args, expected):
    code = main(["calibrate", "--target", str(tiny_dir), "--device", "cpu", "--out", str(tmp_path / "o.yaml"), *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert expected in err and "Traceback" not in err


def test_a_jsonl_suite_without_metrics_is_refused(capsys, tmp_path, tiny_dir):
    suite = tmp_path / "plain.jsonl"
    suite.write_text('{"prompt": "hello"}\n')
    code = main(["calibrate", "--target", str(tiny_dir), "--device", "cpu", "--objective", "quality=0.05",
                 "--suite", str(suite), "--out", str(tmp_path / "o.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and "'plain.jsonl'" not in err and "has no task metric" in err and "math" in err


@pytest.mark.parametrize("shipped", sorted(calibration_profiles.SHIPPED_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_profiles_hold_both_modes_and_their_sweeps(shipped, tmp_path):
    """The embedded models' profiles are quality= fits: greedy and sampled thresholds, each
    with its sweep and the loss bound beside it, no YAML aliases; the sweep replots."""
    profile = calibration_profiles.load(shipped)
    assert profile.data["schema"] == 2 and set(profile.modes()) == {"greedy", "sampled"}
    assert "&id" not in shipped.read_text()
    for mode in ("greedy", "sampled"):
        block = profile.data["modes"][mode]
        assert block["objective"]["kind"] == "quality" and block["sweep"]["rows"]
        assert set(block["loss_bound"]["thresholds"]) == {"logit-ratio", "prob-ratio"}
    assert main(["calibrate", "--replot", str(shipped), "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 0


def test_replot_of_a_profile_without_a_sweep_is_one_line(capsys, tmp_path):
    shipped = OLD_PROFILES[0]
    code = main(["calibrate", "--replot", str(shipped), "--plot", str(tmp_path / "p.png")])
    err = capsys.readouterr().err
    assert code == 2 and "no quality sweep" in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- end to end
def test_quality_calibration_end_to_end(capsys, tmp_path, tiny_dir, tiny_draft_dir, monkeypatch):
    """Strict's own output is the reference text, so strict scores 1 and any relaxation that
    changes the text shows as a drop; the chosen theta must be one whose drops are within DROP."""
    monkeypatch.setattr(notes, "_SHOWN", set())
    prompts = ["abc abc", "hello there", "one two three"]
    suite = tmp_path / "own.jsonl"
    lines = []
    for index, prompt in enumerate(prompts):
        main(["generate", prompt, "--target", str(tiny_dir), "--device", "cpu", "-n", "12", "--json"])
        text = json.loads(capsys.readouterr().out)["text"]
        lines.append(json.dumps({"id": f"s{index}", "prompt": prompt, "reference": text or "x"}))
    suite.write_text("\n".join(lines) + "\n")
    out, plot = tmp_path / "q.yaml", tmp_path / "q.png"
    code = main(["calibrate", "--target", str(tiny_dir), "--device", "cpu", "--objective", "quality=0.05",
                 "--suite", str(suite), "--limit", "3", "--draft", str(tiny_draft_dir), "--thetas", "0.3,0.6,0.95",
                 "--num-draft", "2", "-n", "12", "--out", str(out), "--plot", str(plot), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    printed = json.loads(captured.out)
    profile = calibration_profiles.load(out)
    assert printed["modes"] == json.loads(json.dumps(profile.data["modes"]))
    assert set(profile.modes()) == {"greedy", "sampled"} and profile.data["objective"] == {"kind": "quality", "value": 0.05}
    for mode, block in profile.modes().items():
        sweep = block["sweep"]
        assert [row["theta"] for row in sweep["rows"]] == [0.3, 0.6, 0.95] and sweep["samples"] == 3
        assert sweep["strict"]["own:rouge_l"] == (1.0 if mode == "greedy" else sweep["strict"]["own:rouge_l"])
        held = [row["theta"] for row in sweep["rows"]
                if all(figure["drop"] <= 0.05 for figure in row["metrics"].values())]
        chosen = sweep["chosen"]
        assert chosen is None or chosen in held
        assert block["thresholds"]["logit-ratio"] == (chosen if chosen is not None else 1.0)
        assert block["loss_bound"]["objective"] == {"kind": "loss", "value": 0.05}
        assert set(block["loss_bound"]["thresholds"]) == {"logit-ratio", "prob-ratio"} and block["positions"] > 0
        assert block["drafter"] == str(tiny_draft_dir)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the stored sweep draws again from the profile alone
    again = tmp_path / "again.png"
    assert main(["calibrate", "--replot", str(out), "--plot", str(again)]) == 0
    assert again.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    # greedy decoding picks the greedy mode's threshold from the profile
    code = main(["generate", "abc", "--target", str(tiny_dir), "--verify", "mars", "--calibration", str(out),
                 "-n", "3", "--device", "cpu", "--json"])
    config = json.loads(capsys.readouterr().out)["config"]
    assert code == 0 and config["threshold"] == profile.modes()["greedy"]["thresholds"]["logit-ratio"]


AUTO_PROMPTS = ["abc abc", "hello there", "one two three", "the cat sat", "red green blue", "x y z", "good morning",
                "a b c d", "four five", "why not", "so it goes", "blue sky"]
_OWN_SUITES: dict[str, str] = {}


def own_suite(capsys, tmp_path, tiny_dir) -> Path:
    """A 12-sample suite whose references are strict greedy decoding's own text (strict scores 1),
    made once per tiny target."""
    if str(tiny_dir) not in _OWN_SUITES:
        lines = []
        for index, prompt in enumerate(AUTO_PROMPTS):
            main(["generate", prompt, "--target", str(tiny_dir), "--device", "cpu", "-n", "6", "--json"])
            text = json.loads(capsys.readouterr().out)["text"]
            lines.append(json.dumps({"id": f"s{index}", "prompt": prompt, "reference": text or "x"}))
        _OWN_SUITES[str(tiny_dir)] = "\n".join(lines) + "\n"
    path = tmp_path / "own.jsonl"
    path.write_text(_OWN_SUITES[str(tiny_dir)])
    return path


def auto_calibrate(tiny_dir, tiny_draft_dir, suite, out, drop, limit="auto", *extra):
    return main(["calibrate", "--target", str(tiny_dir), "--device", "cpu", "--objective", f"quality={drop}",
                 "--suite", str(suite), "--limit", limit, "--draft", str(tiny_draft_dir), "--thetas", "0.2",
                 "--num-draft", "2", "-n", "6", "--modes", "greedy", "--out", str(out), *extra])


def test_limit_auto_grows_until_the_decision_is_clear(capsys, tmp_path, tiny_dir, tiny_draft_dir, monkeypatch):
    """On 4 samples the drop's interval straddles DROP; on 8 it is clearly within, so the sweep
    stops there though the suite has 12, and decides as --limit 8 does."""
    monkeypatch.setattr(notes, "_SHOWN", set())
    suite = own_suite(capsys, tmp_path, tiny_dir)
    assert auto_calibrate(tiny_dir, tiny_draft_dir, suite, tmp_path / "auto.yaml", 0.5) == 0
    shown = capsys.readouterr().out
    sweep = calibration_profiles.load(tmp_path / "auto.yaml").data["modes"]["greedy"]["sweep"]
    assert [(step["samples_per_suite"], step["clear"]) for step in sweep["growth"]] == [(4, False), (8, True)]
    assert sweep["samples"] == sweep["samples_per_suite"] == 8 and sweep["decision"] == "clear"
    assert sweep["chosen"] == 0.2 and sweep["rows"][0]["decision"] == "pass"
    needed = sweep["samples_needed"][0]["samples"]
    assert f"a clear decision at theta 0.2 (pass) needs about {needed} samples a suite (this run: 8)" in shown
    assert "(4 -> 8 a suite, --limit auto)" in shown
    # the earlier samples were kept, not decoded again: the same records as a fixed --limit 8
    assert auto_calibrate(tiny_dir, tiny_draft_dir, suite, tmp_path / "fixed.yaml", 0.5, "8") == 0
    fixed = calibration_profiles.load(tmp_path / "fixed.yaml").data
    assert "growth" not in fixed["modes"]["greedy"]["sweep"]
    assert {**fixed["modes"]["greedy"]["sweep"], "growth": sweep["growth"]} == sweep
    assert fixed["prompt_set"] == calibration_profiles.load(tmp_path / "auto.yaml").data["prompt_set"]


def test_limit_auto_stops_at_its_budget(capsys, tmp_path, tiny_dir, tiny_draft_dir, monkeypatch):
    """A drop that stays unclear: the sweep grows to the budget (here 8 samples a suite) and says
    how many a clear decision would need."""
    monkeypatch.setattr(notes, "_SHOWN", set())
    monkeypatch.setattr(sweeping, "AUTO_MAX", 8)
    suite = own_suite(capsys, tmp_path, tiny_dir)
    assert auto_calibrate(tiny_dir, tiny_draft_dir, suite, tmp_path / "auto.yaml", 0.2) == 0
    shown = capsys.readouterr().out
    sweep = calibration_profiles.load(tmp_path / "auto.yaml").data["modes"]["greedy"]["sweep"]
    assert [(step["samples_per_suite"], step["clear"]) for step in sweep["growth"]] == [(4, False), (8, False)]
    assert sweep["decision"] == "unclear" and sweep["chosen"] is None and sweep["rows"][0]["decision"] == "unclear"
    (entry,) = sweep["samples_needed"]
    assert entry["theta"] == 0.2 and entry["samples"] > 8
    assert f"a clear decision at theta 0.2 ({entry['outcome']}) needs about {entry['samples']} samples a suite " \
           "(this run: 8)" in shown
    assert "none clearly held quality: theta 1 (strict), unclear" in shown
