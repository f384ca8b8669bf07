"""The error matrix for `mars calibrate`: bad input, resume files and hand-edited profiles through
the real entry point give exit code 2 and one line on stderr naming the problem, with no traceback."""

from __future__ import annotations

import json

import pytest

from mars_cli.cli import main

from .errors_helpers import MODEL, one_line_error


def test_calibrate_errors(capsys, files, tiny_dir):
    base = ["calibrate", "--target", str(tiny_dir), *MODEL]
    one_line_error(capsys, [*base, "--objective", "speed=1"], "--objective")
    one_line_error(capsys, [*base, "--prompts", str(files["bad_jsonl"])], "line 3")
    one_line_error(capsys, [*base, "--prompts", str(files["a_file"].parent / "none.jsonl")], "cannot read")
    one_line_error(capsys, [*base, "--out", str(files["a_file"] / "p.yaml")], "cannot create")
    one_line_error(capsys, [*base, "--samples", "3"], "--samples")
    one_line_error(capsys, [*base, "--resume", "--out", str(files["a_file"].parent / "never.yaml")], "nothing to resume")


def test_calibrate_resume_gives_the_same_profile(capsys, tmp_path, tiny_dir, monkeypatch):
    from mars_cli.calibration import profiles as calibration_profiles

    args = ["calibrate", "--target", str(tiny_dir), "--samples", "90", "-n", "10", "--seed", "5", *MODEL]
    main([*args, "--out", str(tmp_path / "whole.yaml")])
    calls = {"n": 0}
    original_run = __import__("mars_cli.session", fromlist=["Session"]).Session.run

    def interrupted_run(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return original_run(self, *a, **k)

    monkeypatch.setattr("mars_cli.session.Session.run", interrupted_run)
    out = tmp_path / "resumed.yaml"
    assert main([*args, "--out", str(out)]) == 130
    assert not out.exists() and (tmp_path / "resumed.yaml.partial.json").exists()
    monkeypatch.setattr("mars_cli.session.Session.run", original_run)
    assert main([*args, "--out", str(out), "--resume"]) == 0
    capsys.readouterr()
    assert not (tmp_path / "resumed.yaml.partial.json").exists()
    whole, resumed = calibration_profiles.load(tmp_path / "whole.yaml").data, calibration_profiles.load(out).data
    assert resumed["thresholds"] == whole["thresholds"] and resumed["quantiles"] == whole["quantiles"]


def _shipped_profile() -> dict:
    import yaml

    from mars_cli.calibration import profiles

    return yaml.safe_load((profiles.SHIPPED_DIR / "smollm2-135m.yaml").read_text())


def _edit(data: dict, change) -> dict:
    change(data)
    return data


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["objective"].update(value="two percent"), "field 'objective.value' must be a number"),
    (lambda d: d["modes"]["greedy"].update(objective="quality=0.02"), "field 'modes.greedy.objective.value'"),
    (lambda d: d["modes"]["greedy"]["sweep"].update(chosen="0.9"), "field 'modes.greedy.sweep.chosen'"),
    (lambda d: d["modes"]["greedy"]["sweep"]["rows"][0]["metrics"]["mean_logprob"].update(drop="lots"),
     "field 'modes.greedy.sweep.rows[0].metrics.mean_logprob'"),
    (lambda d: d["modes"]["sampled"]["sweep"].pop("strict"), "field 'modes.sampled.sweep.strict.tau'"),
])
def test_replot_of_a_hand_edited_profile_is_one_line(capsys, tmp_path, change, expected):
    import yaml

    source = tmp_path / "edited.yaml"
    source.write_text(yaml.safe_dump(_edit(_shipped_profile(), change)))
    one_line_error(capsys, ["calibrate", "--replot", str(source), "--plot", str(tmp_path / "p.png")], expected)


def test_replot_draws_rows_without_metrics_and_a_sweep_without_a_choice(capsys, tmp_path):
    import yaml

    def strip(data: dict) -> None:
        for block in data["modes"].values():
            block["sweep"].pop("chosen")
            for row in block["sweep"]["rows"]:
                row.pop("metrics")

    source = tmp_path / "edited.yaml"
    source.write_text(yaml.safe_dump(_edit(_shipped_profile(), strip)))
    assert main(["calibrate", "--replot", str(source), "--plot", str(tmp_path / "p.png")]) == 0, capsys.readouterr().err
    assert (tmp_path / "p.png").stat().st_size > 0


def test_profile_over_the_size_cap_is_refused_unread(capsys, tmp_path, no_model):
    from mars_cli.inputs import PROFILE_LIMIT

    big = tmp_path / "big.yaml"
    with open(big, "w") as handle:
        handle.write("schema: 2\n")
        handle.truncate(PROFILE_LIMIT + 1)  # sparse: the size is what counts
    one_line_error(capsys, ["calibrate", "--replot", str(big), "--plot", str(tmp_path / "p.png")],
                   f"profile {big} is too large ({PROFILE_LIMIT + 1:,} bytes; the limit is 4 MiB)")


@pytest.mark.parametrize("content, expected", [
    (b"\xff\xfe", "resume file"),
    (b"[1, 2]", "not a calibration's resume file"),
    (b'{"signature": null}', "the options differ"),
])
def test_calibrate_resume_file_that_is_damaged(capsys, tmp_path, tiny_dir, no_model, content, expected):
    out = tmp_path / "p.yaml"
    (tmp_path / "p.yaml.partial.json").write_bytes(content)
    one_line_error(capsys, ["calibrate", "--target", str(tiny_dir), "--out", str(out), "--resume", *MODEL], expected)


def test_calibrate_resume_file_with_malformed_positions(capsys, tmp_path, tiny_dir, monkeypatch, no_model):
    from mars_cli.calibration import collection

    real = collection.load_partial

    def spy(path, signature):  # the run's own signature, positions that are not numbers
        path.write_text(json.dumps({"signature": signature, "fit": [["a", "b"]], "held": None}))
        return real(path, signature)

    monkeypatch.setattr("mars_cli.calibration.run.load_partial", spy)
    out = tmp_path / "p.yaml"
    (tmp_path / "p.yaml.partial.json").write_text("{}")
    one_line_error(capsys, ["calibrate", "--target", str(tiny_dir), "--out", str(out), "--resume", *MODEL],
                   "is damaged")
