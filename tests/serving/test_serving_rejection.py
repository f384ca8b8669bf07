"""MARS as the vLLM plugin computes it (mars_cli/serving/rejection.py), without an engine: on
random batches in vLLM's layout its greedy decisions equal our own verifier's, and its sampling
decisions (vLLM's rejection sampling with vLLM's uniforms, not our loop's coupled noise) equal
the pure rules' (rules.sampling_choices), request by request; its output tensor has vLLM's shape
and placeholders; at theta 1 sampling keeps the target's distribution."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mars_cli.calibration.profiles import threshold_at_temperature
from mars_cli.decoding.rules import (DraftBatch, accepted_paths, examined_rows, first_sibling, margin,
                                     sampling_choices, top_two)
from mars_cli.decoding.sampling import SamplingParams, probabilities, process_logits
from mars_cli.decoding.tree import DraftTree
from mars_cli.decoding.verifiers import Verifier
from mars_cli.serving.rejection import PLACEHOLDER, Thresholds, mars_rejection_sample

VOCAB = 12


def random_batch(seed: int, counts: list[int], vocab: int = VOCAB):
    """Per request: k draft tokens, k target rows and a bonus row. Drafts are mostly the target's
    top-1 or top-2 at their row (so chains get accepted, strictly or relaxed), sometimes another
    token; logits are near-ties often enough for low margins to occur."""
    g = torch.Generator().manual_seed(seed)
    requests = []
    for count in counts:
        logits = torch.randn(count + 1, vocab, generator=g) * 0.3 + 2.0  # positive: the logit ratio is defined
        order = logits.argsort(dim=-1, descending=True)
        pick = torch.randint(0, 5, (count,), generator=g)
        drafts = torch.where(pick < 2, order[:count, 0], torch.where(pick < 4, order[:count, 1], order[:count, 5]))
        requests.append((drafts, logits))
    return requests


def vllm_inputs(requests):
    """What vLLM's rejection_sample receives for these requests."""
    tokens = torch.cat([drafts for drafts, _ in requests]).to(torch.int32)
    target = torch.cat([logits[:-1] for _, logits in requests])
    bonus = torch.stack([logits[-1].argmax() for _, logits in requests])[:, None].to(torch.int32)
    return tokens, [drafts.numel() for drafts, _ in requests], target, bonus


def emitted(row: torch.Tensor) -> list[int]:
    return [token for token in row.tolist() if token != PLACEHOLDER]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), counts=st.lists(st.integers(0, 5), min_size=1, max_size=6),
       theta=st.sampled_from([0.5, 0.9, 0.97, 1.0]), measure=st.sampled_from(["logit-ratio", "prob-ratio"]))
def test_greedy_decisions_equal_our_verifier_request_by_request(seed, counts, theta, measure):
    requests = random_batch(seed, counts)
    tokens, num, target, bonus = vllm_inputs(requests)
    greedy = torch.ones(len(counts), dtype=torch.bool)
    outcome = mars_rejection_sample(tokens, num, target, bonus, None, greedy, Thresholds(measure, theta, theta))
    verifier = Verifier("mars", theta, measure, SamplingParams(0.0))  # type: ignore[arg-type]
    for b, (drafts, logits) in enumerate(requests):
        verdict = verifier.verify(logits, DraftTree.chain(drafts.long()))
        accepted = len(verdict.accepted_positions)
        assert emitted(outcome.output_token_ids[b]) == drafts[:accepted].tolist() + [verdict.next_token]
        assert outcome.accepted[b] == accepted
        assert outcome.relaxed[b] == verdict.relaxed
        assert outcome.examined[b] == verdict.examined
        assert outcome.low_margin[b] == verdict.low_margin


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), counts=st.lists(st.integers(0, 4), min_size=1, max_size=5),
       theta=st.sampled_from([0.9, 1.0]), measure=st.sampled_from(["logit-ratio", "prob-ratio"]),
       temperature=st.sampled_from([0.5, 1.0]), draft_q=st.booleans())
def test_sampling_decisions_equal_the_rejection_rule_for_the_same_uniforms(seed, counts, theta, measure,
                                                                            temperature, draft_q):
    """Each request's uniforms are the first draws of a generator seeded per request; vLLM's logits
    arrive divided by T and the theta on the raw scale is converted."""
    requests = random_batch(seed, counts)
    tokens, num, target, bonus = vllm_inputs(requests)
    q = torch.softmax(torch.randn(tokens.numel(), VOCAB, generator=torch.Generator().manual_seed(seed)), -1) \
        if draft_q else None
    uniforms = torch.cat([torch.rand(k, generator=torch.Generator().manual_seed(seed + b)) for b, k in enumerate(num)])
    greedy = torch.zeros(len(counts), dtype=torch.bool)
    outcome = mars_rejection_sample(tokens, num, target / temperature, bonus, q, greedy,
                                    Thresholds(measure, 0.5, theta), torch.full((len(counts),), temperature),
                                    uniforms)
    raw_theta = threshold_at_temperature(theta, measure, temperature)
    start = 0
    for b, (drafts, logits) in enumerate(requests):
        tree = DraftTree.chain(drafts.long(), None if q is None else q[start : start + drafts.numel()])
        own_uniforms = torch.rand(drafts.numel(), generator=torch.Generator().manual_seed(seed + b))
        accepted, relaxed, low = rejection_reference(logits, tree, own_uniforms, raw_theta, measure, temperature)
        assert emitted(outcome.output_token_ids[b])[:-1] == drafts[:accepted].tolist()
        assert outcome.relaxed[b] == relaxed
        assert outcome.low_margin[b] == low
        start += drafts.numel()


def rejection_reference(logits: torch.Tensor, tree: DraftTree, uniforms: torch.Tensor, theta: float, measure: str,
                        temperature: float) -> tuple[int, int, int]:
    """(accepted, relaxed, low-margin examined rows) of one request under the pure rejection rules,
    composed as MARS decides: margins on the processed logits, top-1 or top-2 rescued where low."""
    batch = DraftBatch.of_trees([tree])
    processed = process_logits(logits, SamplingParams(temperature))
    top1, top2, z1, z2 = top_two(processed)
    low = (margin(z1, z2, measure) > theta) & torch.isfinite(z2)  # type: ignore[arg-type]
    in_top_two = (batch.tokens == top1[batch.parent_rows]) | (batch.tokens == top2[batch.parent_rows])
    ok, strict, _ = sampling_choices(batch, probabilities(processed), uniforms, in_top_two, low)
    path, _ = accepted_paths(batch, first_sibling(ok, batch.parent_rows))
    examined = examined_rows(batch, path)
    return int(path.sum()), int((path & ~strict).sum()), int((low & examined).sum())


def test_a_mixed_batch_decides_each_request_by_its_own_mode():
    """Greedy and sampled requests in one batch: each is decided as it would be alone."""
    requests = random_batch(3, [3, 4, 2, 5])
    tokens, num, target, bonus = vllm_inputs(requests)
    greedy = torch.tensor([True, False, True, False])
    uniforms = torch.rand(tokens.numel(), generator=torch.Generator().manual_seed(1))
    mixed = mars_rejection_sample(tokens, num, target, bonus, None, greedy, Thresholds("logit-ratio", 0.9, 0.9),
                                  torch.tensor([0.0, 1.0, 0.0, 1.0]), uniforms)
    alone_greedy = mars_rejection_sample(tokens, num, target, bonus, None, torch.ones(4, dtype=torch.bool),
                                         Thresholds("logit-ratio", 0.9, 0.9))
    alone_sampled = mars_rejection_sample(tokens, num, target, bonus, None, torch.zeros(4, dtype=torch.bool),
                                          Thresholds("logit-ratio", 0.9, 0.9), torch.ones(4), uniforms)
    for b in range(4):
        reference = alone_greedy if greedy[b] else alone_sampled
        assert mixed.accepted[b] == reference.accepted[b]
        assert mixed.relaxed[b] == reference.relaxed[b]
        if greedy[b]:
            assert torch.equal(mixed.output_token_ids[b], reference.output_token_ids[b])


def test_output_has_vllms_shape_placeholders_and_bonus_tokens():
    vocab = 6
    target = torch.full((3, vocab), 0.1)
    target[0, 2] = 5.0  # request 0, draft 0 (token 2): accepted
    target[1, 4] = 5.0  # request 0, draft 1 (token 3): rejected, correction 4
    target[2, 1] = 5.0  # request 2, draft 0 (token 1): accepted, then the bonus
    tokens = torch.tensor([2, 3, 1], dtype=torch.int32)
    bonus = torch.tensor([[0], [5], [3]], dtype=torch.int32)
    outcome = mars_rejection_sample(tokens, [2, 0, 1], target, bonus, None, torch.ones(3, dtype=torch.bool),
                                    Thresholds("logit-ratio", 1.0, 1.0))
    assert outcome.output_token_ids.dtype == torch.int32
    assert outcome.output_token_ids.tolist() == [[2, 4, PLACEHOLDER], [5, PLACEHOLDER, PLACEHOLDER],
                                                 [1, 3, PLACEHOLDER]]
    assert outcome.accepted.tolist() == [1, 0, 1]


def test_relaxed_acceptance_is_the_runner_up_at_a_low_margin_only():
    target = torch.tensor([[3.0, 2.9, 0.0, 0.0],   # low margin (0.967): runner-up 1 accepted
                           [3.0, 1.0, 0.0, 0.0]])  # high margin: runner-up 1 rejected, argmax 0 follows
    tokens = torch.tensor([1, 1], dtype=torch.int32)
    bonus = torch.tensor([[2]], dtype=torch.int32)
    greedy = torch.ones(1, dtype=torch.bool)
    mars = mars_rejection_sample(tokens, [2], target, bonus, None, greedy, Thresholds("logit-ratio", 0.9, 0.9))
    strict = mars_rejection_sample(tokens, [2], target, bonus, None, greedy, Thresholds("logit-ratio", 1.0, 1.0))
    assert mars.output_token_ids.tolist() == [[1, 0, PLACEHOLDER]]
    assert (mars.relaxed.item(), mars.low_margin.item(), mars.examined.item()) == (1, 1, 2)
    assert strict.output_token_ids.tolist() == [[0, PLACEHOLDER, PLACEHOLDER]]


def test_the_greedy_and_sampled_thetas_apply_by_request():
    target = torch.tensor([[3.0, 2.7, 0.0, 0.0]])  # logit ratio 0.9
    tokens, bonus = torch.tensor([1], dtype=torch.int32), torch.tensor([[2]], dtype=torch.int32)
    for greedy_theta, relaxed in ((0.85, 1), (0.95, 0)):
        outcome = mars_rejection_sample(tokens, [1], target, bonus, None, torch.ones(1, dtype=torch.bool),
                                        Thresholds("logit-ratio", greedy_theta, 0.5))
        assert outcome.relaxed.item() == relaxed


def test_prob_ratio_theta_is_converted_to_the_requests_temperature():
    """p2/p1 = exp(-0.5) = 0.607 at T = 1; vLLM hands logits / T, where it is 0.607 ** (1 / T)."""
    raw = torch.tensor([[2.0, 1.5, -5.0, -5.0]])
    tokens, bonus = torch.tensor([1], dtype=torch.int32), torch.tensor([[2]], dtype=torch.int32)
    thresholds = Thresholds("prob-ratio", 0.6, 0.6)
    for temperature in (0.5, 2.0):
        outcome = mars_rejection_sample(tokens, [1], raw / temperature, bonus, None, torch.zeros(1, dtype=torch.bool),
                                        thresholds, torch.tensor([temperature]), torch.tensor([0.999]))
        assert outcome.low_margin.item() == 1  # low at T = 1 stays low at any T


@pytest.mark.parametrize("draft_q", [False, True])
def test_theta_one_keeps_the_target_distribution(draft_q):
    """Two drafts per request drawn from q (or taken as given when q is None); the first two
    tokens follow the target's joint distribution (total variation < 0.02 over 20k sequences)."""
    vocab, requests, rounds = 4, 2000, 10
    g = torch.Generator().manual_seed(7)
    logits = torch.tensor([[1.0, 0.5, 0.0, -1.0], [0.2, 1.2, -0.3, 0.0], [0.0, 0.0, 1.0, 0.5]])
    p = torch.softmax(logits, dim=-1)
    q_rows = torch.softmax(torch.tensor([[0.0, 1.0, 0.5, 0.0], [1.0, 0.0, 0.0, 0.5]]), dim=-1)
    counts = torch.zeros(vocab, vocab)
    for _ in range(rounds):
        first = torch.multinomial(q_rows[0].expand(requests, vocab), 1, generator=g)[:, 0]
        second = torch.multinomial(q_rows[1].expand(requests, vocab), 1, generator=g)[:, 0]
        tokens = torch.stack([first, second], dim=1).reshape(-1).to(torch.int32)
        # the target's row after the first draft depends on it: row 1 when it is token 1, row 2 otherwise
        after_first = torch.where(first[:, None] == 1, logits[1], logits[2])
        target = torch.stack([logits[0].expand(requests, vocab), after_first], dim=1).reshape(-1, vocab)
        q = torch.stack([q_rows[0].expand(requests, vocab), q_rows[1].expand(requests, vocab)], 1).reshape(-1, vocab)
        bonus = torch.zeros(requests, 1, dtype=torch.int32)
        outcome = mars_rejection_sample(tokens, [2] * requests, target, bonus, q if draft_q else None,
                                        torch.zeros(requests, dtype=torch.bool), Thresholds("logit-ratio", 1.0, 1.0),
                                        torch.ones(requests), torch.rand(tokens.numel(), generator=g))
        out = outcome.output_token_ids.long()
        # when the first draft was rejected the second token comes from the next round, which draws
        # it from the target's row after the first token (that round's first token: checked here too)
        next_round = torch.multinomial(torch.softmax(torch.where(out[:, :1] == 1, logits[1], logits[2]), -1), 1,
                                       generator=g)[:, 0]
        second_token = torch.where(out[:, 1] != PLACEHOLDER, out[:, 1], next_round)
        counts.index_put_((out[:, 0], second_token), torch.ones(requests), accumulate=True)
    expected = p[0][:, None] * torch.stack([p[1] if token == 1 else p[2] for token in range(vocab)])
    assert 0.5 * (counts / counts.sum() - expected).abs().sum() < 0.02
