"""MARS inside vLLM's engine: at a threshold nothing passes it is vLLM's strict decoding token for
token; at theta 0.9 it accepts at least as much, and every relaxed token is the target's
runner-up at a low-margin position (read from the target's raw logits, which vLLM returns as
logprobs); sampled requests go through the same rule."""

from __future__ import annotations

import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from conftest import NEW_TOKENS
from mars_cli.serving import settings

STRICT = None


def theta(value: float) -> dict:
    return settings.resolve({"theta": value}, "", speculative=True)


def run(llm, prompts, rule, **sampling):
    """Outputs and MARS's counters for `prompts` under `rule` (None: vLLM's strict rule)."""
    llm.collective_rpc("mars_set_thresholds", args=(rule,))
    llm.collective_rpc("mars_reset_counters")
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": NEW_TOKENS, "logprobs": 2, **sampling})
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
    return [output.outputs[0] for output in outputs], llm.collective_rpc("mars_counters")[0]


def tau(completions) -> float:
    """Tokens per target forward: 1 + accepted drafts per verification round."""
    rounds = sum(sum(c.spec_decode_metrics.histogram) for c in completions)
    accepted = sum(j * n for c in completions for j, n in enumerate(c.spec_decode_metrics.histogram))
    return 1 + accepted / rounds


@pytest.mark.parametrize("drafter", ["head_engine", "ngram_engine"])
def test_a_threshold_nothing_passes_is_vllms_strict_decoding(drafter, prompts, request):
    llm = request.getfixturevalue(drafter)
    strict, _ = run(llm, prompts, STRICT)
    mars, counts = run(llm, prompts, theta(1.0))
    assert [c.token_ids for c in mars] == [c.token_ids for c in strict]
    assert counts["relaxed"] == 0 and counts["low_margin"] == 0
    assert counts["rounds"] > 0  # MARS's rule decided them, not vLLM's


@pytest.mark.parametrize("drafter", ["head_engine", "ngram_engine"])
def test_theta_09_relaxes_only_runner_ups_at_low_margins(drafter, prompts, request):
    llm = request.getfixturevalue(drafter)
    strict, _ = run(llm, prompts, STRICT)
    mars, counts = run(llm, prompts, theta(0.9))
    assert tau(mars) >= tau(strict)
    relaxed_seen = 0
    for completion in mars:
        for token, top in zip(completion.token_ids, completion.logprobs):
            ranked = sorted(top.values(), key=lambda entry: entry.rank)
            z1 = ranked[0].logprob  # raw logits (logprobs_mode="raw_logits")
            rank = top[token].rank
            assert rank in (1, 2), f"token {token} is the target's rank-{rank} choice"
            if rank == 2:
                assert top[token].logprob / z1 > 0.9  # the logit ratio z2 / z1: a low margin
                relaxed_seen += 1
    assert 0 < relaxed_seen <= counts["relaxed"]  # drafts relaxed past max_tokens are cut off
    assert counts["low_margin"] >= counts["relaxed"]


def test_sampled_requests_are_decided_by_mars_too(head_engine, fresh_prompts):
    """At T = 0.8 the plugin decides the rounds (its counters move); theta 1 relaxes nothing and
    sees no low margin. (Seeded sampling is not compared run to run: vLLM's CPU build does not
    repeat it even under its own strict rule; the distribution is tested on the rule itself.)
    Prompts the greedy tests did not send: on theirs, in full runs of this module, the sampled
    requests once accepted no draft in 288 rounds and once saw no low-margin position
    (docs/serving.md), so neither is asserted; relaxing only at low margins is."""
    _, relaxed = run(head_engine, fresh_prompts, theta(0.9), temperature=0.8, seed=11)
    _, exact = run(head_engine, fresh_prompts, theta(1.0), temperature=0.8, seed=11)
    assert relaxed["rounds"] > 0 and relaxed["low_margin"] >= relaxed["relaxed"]
    assert exact["rounds"] > 0 and exact["relaxed"] == exact["low_margin"] == 0
