"""The "mars" key of additional_config: good settings alone switch MARS on; bad ones are refused
while vLLM builds its config, before any engine starts, with one line that names the fix."""

from __future__ import annotations

import pytest

from conftest import TARGET
from mars_cli.calibration.profiles import SHIPPED_DIR
from mars_cli.serving.engine import EngineSpec, llm_arguments


def build(draft: str, mars: dict):
    from vllm import LLM

    return LLM(**llm_arguments(EngineSpec(TARGET, draft, max_model_len=512, extra={"enforce_eager": True}), mars))


@pytest.mark.parametrize("mars, draft, says", [
    ({"theta": 1.5}, "ngram", '"theta" must be a number in (0, 1]'),
    ({"theta": 0.9}, "none", "add --speculative-config"),
    ({"profile": str(SHIPPED_DIR / "gemma3-270m.yaml")}, "ngram", "calibrated for 'gemma3-270m'"),
    ({"treshold": 0.9}, "ngram", "unknown key 'treshold'"),
    # the marker of a resolved mapping is user input too: checked like the rest
    ({"resolved": True, "measure": "logit-ratio"}, "ngram", 'with "resolved" must hold exactly'),
    ({"resolved": True, "measure": "bogus", "greedy": 0.9, "sampled": 0.9, "source": "theta"}, "ngram",
     '"measure" must be one of'),
    ({"resolved": True, "measure": "logit-ratio", "greedy": float("nan"), "sampled": 0.9, "source": "theta"},
     "ngram", '"greedy" must be a threshold in (0, 1]'),
    ({"resolved": True, "measure": "logit-ratio", "greedy": 5, "sampled": 5, "source": "theta"}, "ngram",
     '"greedy" must be a threshold in (0, 1]'),
    ({"profile": str(SHIPPED_DIR / "gemma3-270m.yaml"), "force": "no"}, "ngram", '"force" must be true or false'),
])
def test_bad_mars_settings_are_one_clear_error(mars, draft, says):
    with pytest.raises(Exception) as raised:
        build(draft, mars)
    message = str(raised.value)
    assert says in message
    assert "mars: " in message


def test_the_config_alone_switches_mars_on():
    """No rule switch: the "mars" key of additional_config is what puts MARS in the sampler (the
    path `vllm serve` and `mars serve` take)."""
    from vllm import SamplingParams

    llm = build("ngram", {"theta": 0.9})
    try:
        llm.generate(["The capital of France is Paris. The capital of France is"],
                     SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
        counts = llm.collective_rpc("mars_counters")[0]
    finally:
        llm.llm_engine.engine_core.shutdown()
    assert counts["rounds"] > 0 and counts["drafted"] > 0  # MARS's rule decided them
