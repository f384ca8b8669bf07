"""The "mars" key of vLLM's additional_config, resolved without vLLM: explicit theta, profiles by
path or by the target's fingerprint, and one-line errors naming the fix."""

from __future__ import annotations

import pytest

from mars_cli.calibration.profiles import SHIPPED_DIR
from mars_cli.errors import UserError
from mars_cli.serving import settings
from mars_cli.serving.engine import EngineSpec, llm_arguments, speculative_config


def test_an_explicit_theta_serves_both_modes(tiny_dir):
    resolved = settings.resolve({"theta": 0.8, "measure": "prob-ratio"}, tiny_dir, speculative=True)
    assert (resolved["measure"], resolved["greedy"], resolved["sampled"], resolved["source"]) == \
        ("prob-ratio", 0.8, 0.8, "theta")
    assert settings.resolve(resolved, tiny_dir, speculative=True) == resolved  # resolved once
    assert "theta 0.8 (greedy)" in settings.describe(resolved)


@pytest.mark.parametrize("given, says", [
    ({"theta": 0}, '"theta" must be a number in (0, 1]'),
    ({"theta": 1.01}, '"theta" must be a number in (0, 1]'),
    ({"theta": float("nan")}, '"theta" must be a number in (0, 1]'),
    ({"theta": True}, '"theta" must be a number in (0, 1]'),
    ({"theta": 0.9, "measure": "entropy"}, '"measure" must be one of logit-ratio, prob-ratio'),
    ({"threshold": 0.9}, "unknown key 'threshold'"),
    ({"profile": ""}, '"profile" must be a profile file'),
    (0.9, 'must be a mapping, e.g. {"mars": {"theta": 0.9}}'),
])
def test_bad_settings_are_one_line(tiny_dir, given, says):
    with pytest.raises(UserError) as raised:
        settings.resolve(given, tiny_dir, speculative=True)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_mars_without_speculative_decoding_names_the_fix(tiny_dir):
    with pytest.raises(UserError, match="add --speculative-config"):
        settings.resolve({"theta": 0.9}, tiny_dir, speculative=False)


def test_a_profile_for_another_model_is_refused_unless_forced(tiny_dir):
    other = str(SHIPPED_DIR / "gemma3-270m.yaml")
    with pytest.raises(UserError, match="calibrated for 'gemma3-270m'.*add \"force\": true"):
        settings.resolve({"profile": other}, tiny_dir, speculative=True)
    forced = settings.resolve({"profile": other, "force": True}, tiny_dir, speculative=True)
    assert (forced["source"], forced["greedy"], forced["sampled"]) == (other, 1.0, 0.97)  # each mode its own


def test_auto_without_a_matching_profile_is_the_papers_theta(tiny_dir):
    resolved = settings.resolve({}, tiny_dir, speculative=True)
    assert (resolved["greedy"], resolved["source"]) == (0.9, "default")
    assert "no profile matches" in settings.describe(resolved)


@pytest.mark.embedded
def test_auto_finds_the_shipped_profile_of_the_embedded_model():
    from mars_cli.calibration import profiles
    from mars_cli.serving.engine import target_directory

    resolved = settings.resolve({"profile": "auto"}, target_directory("smollm2-135m"), speculative=True)
    profile = profiles.load(SHIPPED_DIR / "smollm2-135m.yaml")
    assert resolved["source"] == str(profile.path)
    assert resolved["greedy"] == profiles.raw_threshold(profile, "logit-ratio", 0.0)
    assert resolved["sampled"] == profiles.raw_threshold(profile, "logit-ratio", 1.0)


def test_drafters_map_onto_vllms_speculative_configs(tiny_dir, tiny_draft_dir, tmp_path):
    assert speculative_config("none", str(tiny_dir), 3) is None
    assert speculative_config("ngram", str(tiny_dir), 4) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    assert speculative_config(str(tiny_draft_dir), str(tiny_dir), 2) == {
        "method": "draft_model", "model": str(tiny_draft_dir), "num_speculative_tokens": 2}
    with pytest.raises(UserError, match="draft head not found"):
        speculative_config(f"head:{tmp_path / 'nothing'}", str(tiny_dir), 3)
    single = tmp_path / "head.safetensors"
    single.write_bytes(b"")
    with pytest.raises(UserError, match="vLLM loads EAGLE-3 head directories"):
        speculative_config(f"head:{single}", str(tiny_dir), 3)
    with pytest.raises(UserError, match="no draft head found"):
        speculative_config("head", str(tiny_dir), 3)
    with pytest.raises(UserError, match="--num-draft must be between 1 and 16"):
        speculative_config("ngram", str(tiny_dir), 0)


def test_llm_arguments_switch_mars_on_through_additional_config(tiny_dir):
    arguments = llm_arguments(EngineSpec(str(tiny_dir), "ngram"), {"theta": 0.9})
    assert arguments["additional_config"] == {"mars": {"theta": 0.9}}
    assert arguments["per_request_spec_decode_metrics"] == "summary"
    assert "additional_config" not in llm_arguments(EngineSpec(str(tiny_dir), "ngram"), None)


GOOD_RESOLVED = {"resolved": True, "measure": "logit-ratio", "greedy": 0.9, "sampled": 0.9, "source": "theta"}


@pytest.mark.parametrize("forged, says", [
    ({**GOOD_RESOLVED, "greedy": float("nan")}, '"greedy" must be a threshold in (0, 1]'),
    ({**GOOD_RESOLVED, "greedy": -1}, '"greedy" must be a threshold in (0, 1]'),
    ({**GOOD_RESOLVED, "sampled": 2}, '"sampled" must be a threshold in (0, 1]'),
    ({**GOOD_RESOLVED, "greedy": 5, "sampled": 5}, '"greedy" must be a threshold in (0, 1]'),
    ({**GOOD_RESOLVED, "greedy": "0.9"}, '"greedy" must be a threshold in (0, 1]'),
    ({**GOOD_RESOLVED, "sampled": True}, '"sampled" must be a threshold in (0, 1]'),
    ({**GOOD_RESOLVED, "measure": "bogus"}, '"measure" must be one of logit-ratio, prob-ratio'),
    ({**GOOD_RESOLVED, "source": ""}, '"source" must name where'),
    ({"resolved": True, "measure": "logit-ratio"}, 'with "resolved" must hold exactly'),  # crashed later with KeyError
    ({"resolved": True}, 'with "resolved" must hold exactly'),
    ({**GOOD_RESOLVED, "resolved": "yes"}, 'with "resolved" must hold exactly'),
    ({**GOOD_RESOLVED, "resolved": 1}, 'with "resolved" must hold exactly'),
    ({**GOOD_RESOLVED, "theta": 0.5}, 'with "resolved" must hold exactly'),
])
def test_a_mapping_claiming_to_be_resolved_is_checked_like_any_other(tiny_dir, forged, says):
    """additional_config is user input: the marker of a resolved mapping skips no check, at
    resolution and again where the sampler reads its thresholds."""
    for read in (lambda: settings.resolve(forged, tiny_dir, speculative=True), lambda: settings.thresholds(forged)):
        with pytest.raises(UserError) as raised:
            read()
        assert says in str(raised.value) and "\n" not in str(raised.value)


def test_a_genuine_resolved_mapping_reads_back_as_itself(tiny_dir):
    resolved = settings.resolve({"theta": 0.7}, tiny_dir, speculative=True)
    assert settings.resolve(resolved, tiny_dir, speculative=True) == resolved
    assert settings.thresholds(resolved).greedy == 0.7
    with pytest.raises(UserError, match="add --speculative-config"):  # no speculative config: refused resolved too
        settings.resolve(resolved, tiny_dir, speculative=False)


@pytest.mark.parametrize("force", ["no", "false", 1, 0, None, "yes"])
def test_force_must_be_a_boolean(tiny_dir, force):
    """"force": "no" was taken as true (any non-empty string was)."""
    other = str(SHIPPED_DIR / "gemma3-270m.yaml")
    with pytest.raises(UserError, match='"force" must be true or false'):
        settings.resolve({"profile": other, "force": force}, tiny_dir, speculative=True)
