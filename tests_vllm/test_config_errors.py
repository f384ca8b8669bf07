"""Bad MARS settings are refused while vLLM builds its config, before any engine starts, with one
line that names the fix."""

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
])
def test_bad_mars_settings_are_one_clear_error(mars, draft, says):
    with pytest.raises(Exception) as raised:
        build(draft, mars)
    message = str(raised.value)
    assert says in message
    assert "mars: " in message
