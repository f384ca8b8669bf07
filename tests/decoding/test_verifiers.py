"""The verifier on hand-built logits, and property tests over random ones (chains: a chain is the
tree whose node i is the child of node i - 1, `DraftTree.chain`)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mars_cli.decoding.rules import DraftBatch, logit_ratio, prob_ratio, residual_distribution, top_two
from mars_cli.decoding.sampling import PositionNoise, SamplingParams, process_logits
from mars_cli.decoding.tree import DraftTree
from mars_cli.decoding.verifiers import Verifier

NEG_INF = float("-inf")
GREEDY = SamplingParams(0.0)


def rows(*values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def chain(drafts, q: torch.Tensor | None = None) -> DraftTree:
    tokens = drafts if isinstance(drafts, torch.Tensor) else torch.tensor(drafts, dtype=torch.long)
    return DraftTree.chain(tokens, q)


def accepted(verdict) -> int:
    return len(verdict.accepted_positions)


def mars(threshold: float = 0.9, measure: str = "logit-ratio", sampling: SamplingParams = GREEDY) -> Verifier:
    return Verifier("mars", threshold, measure, sampling)  # type: ignore[arg-type]


STRICT = Verifier("strict")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The rules run on tiny tensors: one intra-op thread is fastest, and on a loaded machine
    two threads cost ~100x (synchronisation), so this module runs single-threaded."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- margins
def test_top_two_breaks_ties_like_argmax():
    top1, top2, z1, z2 = top_two(rows([1.0, 3.0, 3.0, 0.5]))
    assert (top1.item(), top2.item()) == (1, 2)
    assert z1.item() == z2.item() == 3.0


def test_logit_ratio_is_the_papers_measure_and_not_shift_invariant():
    z1, z2 = torch.tensor([2.0, 5.0]), torch.tensor([1.8, 4.8])
    assert logit_ratio(z1, z2).tolist() == pytest.approx([0.9, 0.96])
    assert prob_ratio(z1, z2).tolist() == pytest.approx([math.exp(-0.2)] * 2)


def test_logit_ratio_never_relaxes_nonpositive_top1():
    ratio = logit_ratio(torch.tensor([0.0, -1.0, -3.0]), torch.tensor([-0.1, -1.05, -3.0]))
    assert torch.isneginf(ratio).all()


def test_masked_runner_up_has_no_margin():
    z1, z2 = torch.tensor([2.0]), torch.tensor([NEG_INF])
    assert torch.isneginf(logit_ratio(z1, z2)).all()
    assert prob_ratio(z1, z2).item() == 0.0


# ----------------------------------------------------------------------------- greedy branches
def test_strict_greedy_accepts_matching_prefix_and_corrects():
    logits = rows([0, 5, 1], [4, 0, 1], [0, 1, 6], [3, 0, 0])
    verdict = STRICT.verify(logits, chain([1, 0, 1]))
    assert (accepted(verdict), verdict.next_token) == (2, 2)
    verdict = STRICT.verify(logits, chain([1, 0, 2]))
    assert (accepted(verdict), verdict.next_token) == (3, 0)  # bonus token from the last row
    assert verdict.examined == 3 and verdict.relaxed == 0 and verdict.low_margin == 0 and verdict.margins is None


def test_a_chain_verdict_names_the_accepted_prefix_positions():
    logits = rows([0, 5, 1], [4, 0, 1], [0, 1, 6], [3, 0, 0])
    assert STRICT.verify(logits, chain([1, 0, 1])).accepted_positions == [0, 1]
    assert mars(0.5).verify(logits, chain([1, 0, 2])).accepted_positions == [0, 1, 2]
    assert STRICT.verify(logits, chain([2, 0, 2])).accepted_positions == []


def test_mars_greedy_accepts_runner_up_only_when_low_margin():
    # position 0: z = (10, 9.5) -> r = 0.95 (low margin); position 1: (10, 5) -> r = 0.5
    logits = rows([10, 9.5, 0], [5, 10, 0], [0, 0, 1])
    verdict = mars(0.9).verify(logits, chain([1, 0]))
    assert accepted(verdict) == 1 and verdict.next_token == 1 and verdict.relaxed == 1
    assert verdict.examined == 2 and verdict.low_margin == 1
    assert verdict.margins.tolist() == pytest.approx([0.95, 0.5])
    assert accepted(STRICT.verify(logits, chain([1, 0]))) == 0


def test_mars_greedy_never_accepts_third_choice():
    logits = rows([10, 9.9, 9.8], [1, 0, 0])
    verdict = mars(0.5).verify(logits, chain([2]))
    assert accepted(verdict) == 0 and verdict.next_token == 0


def test_mars_greedy_tie_counts_as_low_margin():
    logits = rows([3, 3, 0], [1, 0, 0])
    verdict = mars(0.99).verify(logits, chain([1]))
    assert accepted(verdict) == 1 and verdict.relaxed == 1 and verdict.low_margin == 1


def test_mars_greedy_negative_top1_is_never_relaxed_by_logit_ratio():
    logits = rows([-1.0, -1.01, -5], [1, 0, 0])
    assert accepted(mars(0.9).verify(logits, chain([1]))) == 0
    # the shift-invariant measure does relax it: p2/p1 = exp(-0.01)
    assert accepted(mars(0.9, "prob-ratio").verify(logits, chain([1]))) == 1


def test_mars_sampling_never_accepts_a_masked_runner_up():
    # top-k = 1 masks the runner-up; even an absurdly permissive theta must not accept it
    sampling = SamplingParams(1.0, top_k=1)
    logits = rows([5.0, 4.99, 0], [1, 0, 0])
    for trial in range(50):
        verdict = mars(1e-6, "prob-ratio", sampling).verify(logits, chain([1]), PositionNoise(trial, 3))
        assert accepted(verdict) == 0 and verdict.next_token == 0


def test_empty_draft_is_one_plain_step():
    verdict = STRICT.verify(rows([0, 2, 1]), DraftTree.empty("cpu"))
    assert (accepted(verdict), verdict.next_token, verdict.examined) == (0, 1, 0)
    verdict = mars(0.1).verify(rows([0, 2, 1]), DraftTree.empty("cpu"))
    assert (accepted(verdict), verdict.next_token, verdict.examined, verdict.low_margin) == (0, 1, 0, 0)
    assert verdict.margins is not None and verdict.margins.numel() == 0


def test_nan_logits_are_refused():
    with pytest.raises(FloatingPointError):
        STRICT.verify(rows([0, float("nan"), 1], [0, 1, 2]), chain([1]))
    with pytest.raises(FloatingPointError):
        mars(0.9, sampling=SamplingParams(1.0)).verify(rows([float("nan")] * 3, [0, 1, 2]), chain([1]))


def test_nan_logits_in_one_request_refuse_the_whole_batch():
    """A faulty row anywhere in a batch raises rather than emitting for the other requests."""
    logits = rows([0, 2, 1], [0, 1, 2], [1, float("nan"), 0])
    batch = DraftBatch.of_trees([chain([1]), DraftTree.empty("cpu")])
    with pytest.raises(FloatingPointError):
        STRICT.verify_batch(logits, batch)
    healthy = rows([0, 2, 1], [0, 1, 2], [1, 0, 0])
    assert [(v.accepted_positions, v.next_token) for v in STRICT.verify_batch(healthy, batch)] == [([0], 2), ([], 0)]


# ----------------------------------------------------------------------------- sampling branches
def test_sampling_mars_accepts_top_two_deterministically_at_low_margin():
    sampling = SamplingParams(1.0)
    # the draft is the runner-up with p(x) tiny relative to q(x) = 1 (one-hot): strict rejects
    # almost always, MARS accepts always because r = 9.9/10 > 0.9
    logits = rows([10.0, 9.9, -20], [0, 0, 0])
    outcomes = [mars(0.9, sampling=sampling).verify(logits, chain([1]), PositionNoise(trial, 3)) for trial in range(40)]
    assert all(accepted(v) == 1 for v in outcomes)
    assert sum(v.relaxed for v in outcomes) > 0


def test_sampling_mars_outside_top_two_uses_strict_rule():
    sampling = SamplingParams(1.0)
    logits = rows([10.0, 9.9, 9.8, -50], [0, 0, 0, 0])
    outcomes = [accepted(mars(0.5, sampling=sampling).verify(logits, chain([3]), PositionNoise(trial, 4)))
                for trial in range(40)]
    assert outcomes == [0] * 40  # p(x) ~ e^-60: strict rejects, MARS may not rescue rank 4


def test_residual_is_normalised_positive_part():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    q = torch.tensor([[0.2, 0.6, 0.2]])
    assert residual_distribution(p, q)[0].tolist() == pytest.approx([1.0, 0.0, 0.0])
    assert residual_distribution(p, p)[0].tolist() == pytest.approx(p[0].tolist())


def _first_tokens(verifier: Verifier, logits: torch.Tensor, q: torch.Tensor | None, rounds: int, per_batch: int,
                  seed: int) -> tuple[torch.Tensor, list]:
    """`rounds` independent rounds of one chain (batches of `per_batch` requests sharing the
    target's logits): the first emitted token of each (drafts[0] if accepted, else the next
    token), and every verdict. Drafts are drawn from q (uniformly at random for one-hot q)."""
    k, vocab = logits.shape[0] - 1, logits.shape[1]
    drafts_generator = torch.Generator().manual_seed(seed)
    firsts, verdicts = [], []
    for round_index in range(rounds // per_batch):
        if q is not None:
            drafts = torch.multinomial(q, per_batch, replacement=True, generator=drafts_generator).T
        else:
            drafts = torch.randint(vocab, (per_batch, k), generator=drafts_generator)
        batch = DraftBatch.of(drafts.reshape(-1), torch.arange(-1, k - 1).repeat(per_batch), [k] * per_batch,
                              None if q is None else q.repeat(per_batch, 1))
        noises = [PositionNoise(seed * 1_000_003 + round_index * per_batch + r, vocab) for r in range(per_batch)]
        round_verdicts = verifier.verify_batch(logits.repeat(per_batch, 1), batch, noises, [0] * per_batch)
        firsts += [drafts[r, 0].item() if v.accepted_positions else v.next_token for r, v in enumerate(round_verdicts)]
        verdicts += round_verdicts
    return torch.tensor(firsts), verdicts


@pytest.mark.parametrize("with_q", [True, False])
def test_strict_sampling_first_token_follows_the_target_and_unreachable_mars_equals_strict(with_q):
    """Coupled sampling reproduces p exactly: over 20,000 rounds of a chain whose drafts come
    from q (or, one-hot, are arbitrary), the first emitted token follows p within a total
    variation fixed from the sample size. MARS with a threshold nothing passes (prob-ratio <= 1)
    decides every round exactly as strict with the same noise, so it is exact too."""
    torch.manual_seed(0)
    vocab, k, draws = 5, 2, 20_000
    sampling = SamplingParams(1.0)
    target_logits = torch.randn(k + 1, vocab) * 1.5
    p0 = torch.softmax(target_logits[0], -1)
    q = torch.softmax(torch.randn(k, vocab) * 1.5, -1) if with_q else None
    proposal = q[0] if with_q else torch.full((vocab,), 1 / vocab)
    assert 0.5 * (proposal - p0).abs().sum() > 0.15  # accepting every draft would fail the test

    strict_firsts, strict_verdicts = _first_tokens(Verifier("strict", sampling=sampling), target_logits, q, draws,
                                                   250, seed=3)
    tv = 0.5 * (torch.bincount(strict_firsts, minlength=vocab) / draws - p0).abs().sum().item()
    # E[TV] <= 0.5 * sum sqrt(p(1-p)/n) ~ 0.008 here; 0.03 leaves room but catches a wrong rule
    assert tv < 0.03, tv

    mars_firsts, mars_verdicts = _first_tokens(mars(1.0, "prob-ratio", sampling), target_logits, q, draws, 250,
                                               seed=3)
    assert torch.equal(mars_firsts, strict_firsts)
    assert [(v.accepted_positions, v.next_token) for v in mars_verdicts] == \
        [(v.accepted_positions, v.next_token) for v in strict_verdicts]
    assert sum(v.relaxed for v in mars_verdicts) == 0 and sum(v.low_margin for v in mars_verdicts) == 0


def test_single_sequence_sampling_equals_a_batch_of_one():
    """`verify` is `verify_batch` on the batch of one: same noise and position, same verdict."""
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(5))
    q = torch.softmax(torch.randn(3, 6, generator=torch.Generator().manual_seed(6)), -1)
    tree = chain([1, 2, 3], q)
    verifier = mars(0.5, "prob-ratio", SamplingParams(0.8))
    for seed in range(20):
        alone = verifier.verify(logits, tree, PositionNoise(seed, 6), seed)
        (batched,) = verifier.verify_batch(logits, DraftBatch.of_trees([tree]), [PositionNoise(seed, 6)], [seed])
        assert (alone.accepted_positions, alone.next_token, alone.relaxed, alone.examined, alone.low_margin) == \
            (batched.accepted_positions, batched.next_token, batched.relaxed, batched.examined, batched.low_margin)
        assert torch.equal(alone.margins, batched.margins)


# ----------------------------------------------------------------------------- properties
finite_logits = st.floats(min_value=-30, max_value=30, allow_nan=False, width=32)


@st.composite
def rounds(draw, positive: bool = False):
    vocab = draw(st.integers(2, 8))
    k = draw(st.integers(0, 5))
    values = draw(st.lists(finite_logits, min_size=(k + 1) * vocab, max_size=(k + 1) * vocab))
    logits = torch.tensor(values).reshape(k + 1, vocab)
    if positive:
        logits = logits.abs() + 0.1
    if draw(st.booleans()) and vocab > 2:  # mask some entries, as top-k would
        mask_col = draw(st.integers(0, vocab - 1))
        logits[:, mask_col] = NEG_INF
        logits[:, (mask_col + 1) % vocab] = logits[:, (mask_col + 1) % vocab].clamp_min(0.5)
    drafts = torch.tensor(draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k)), dtype=torch.long)
    return logits, drafts


@settings(max_examples=100, deadline=None)
@given(rounds(positive=True), st.sampled_from(["logit-ratio", "prob-ratio"]))
def test_mars_with_unreachable_threshold_equals_strict_greedy(case, measure):
    logits, drafts = case
    # logit-ratio <= 1 for positive logits and prob-ratio <= 1 always: theta = 1 is unreachable
    # except for exact ties, which we break apart here
    logits = logits + torch.arange(logits.shape[1]) * 1e-3
    strict = STRICT.verify(logits, chain(drafts))
    relaxed = mars(1.0, measure).verify(logits, chain(drafts))
    assert (strict.accepted_positions, strict.next_token) == (relaxed.accepted_positions, relaxed.next_token)
    assert relaxed.relaxed == 0 and relaxed.low_margin == 0 and relaxed.examined == strict.examined


@settings(max_examples=100, deadline=None)
@given(rounds(), st.sampled_from(["logit-ratio", "prob-ratio"]), st.integers(0, 2**31 - 1))
def test_mars_with_unreachable_threshold_equals_strict_sampling(case, measure, seed):
    logits, drafts = case
    sampling = SamplingParams(0.7)
    logits = logits + torch.arange(logits.shape[1]) * 1e-3
    if measure == "logit-ratio":  # positive finite logits keep r < 1
        logits = torch.where(torch.isfinite(logits), logits.abs() + 0.1, logits)
    vocab = logits.shape[1]
    a = Verifier("strict", sampling=sampling).verify(logits, chain(drafts), PositionNoise(seed, vocab))
    b = mars(1.0, measure, sampling).verify(logits, chain(drafts), PositionNoise(seed, vocab))
    assert (a.accepted_positions, a.next_token) == (b.accepted_positions, b.next_token)
    assert b.relaxed == 0


@settings(max_examples=100, deadline=None)
@given(rounds(), st.floats(0.01, 1.0), st.sampled_from(["logit-ratio", "prob-ratio"]))
def test_mars_greedy_only_rescues_top_two_and_never_accepts_less(case, theta, measure):
    logits, drafts = case
    strict = STRICT.verify(logits, chain(drafts))
    verdict = mars(theta, measure).verify(logits, chain(drafts))
    n = accepted(verdict)
    assert verdict.accepted_positions == list(range(n))  # a chain accepts a prefix
    assert n >= accepted(strict)
    top1, top2, _, z2 = top_two(logits)
    for position in range(n):
        token = drafts[position].item()
        assert token in (top1[position].item(), top2[position].item())
        if token != top1[position].item():
            assert torch.isfinite(z2[position])
    assert verdict.relaxed == sum(int(drafts[i].item() != top1[i].item()) for i in range(n))
    assert verdict.next_token == top1[n].item()  # the correction, or the bonus past the last draft
    assert verdict.examined == min(n + 1, drafts.shape[0])


@settings(max_examples=100, deadline=None)
@given(rounds(), st.floats(0.01, 1.0), st.integers(0, 2**31 - 1),
       st.sampled_from([SamplingParams(1.0), SamplingParams(0.5, top_k=2), SamplingParams(1.3, top_p=0.8)]))
def test_sampling_rules_emit_only_tokens_the_target_allows(case, theta, seed, sampling):
    logits, drafts = case
    processed = process_logits(logits, sampling)
    for verifier in (Verifier("strict", sampling=sampling), mars(theta, "prob-ratio", sampling)):
        verdict = verifier.verify(logits, chain(drafts), PositionNoise(seed, logits.shape[1]))
        n = accepted(verdict)
        assert verdict.accepted_positions == list(range(n)) and 0 <= n <= drafts.shape[0]
        assert torch.isfinite(processed[n, verdict.next_token])
        for position in range(n):
            assert torch.isfinite(processed[position, drafts[position]])


extreme_logits = st.one_of(
    st.floats(min_value=-1e30, max_value=1e30, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1e-30, -1e-30, 3.0e38, -3.0e38, NEG_INF]),
)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 6), st.integers(0, 4), st.data(), st.booleans(),
       st.sampled_from(["strict", "mars"]), st.sampled_from(["logit-ratio", "prob-ratio"]),
       st.sampled_from([SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.3, top_k=2),
                        SamplingParams(2.0, top_p=0.5)]))
def test_fuzz_rules_never_emit_garbage(vocab, k, data, inject_nan, rule, measure, sampling):
    """Any logits at all: either a verdict that only emits tokens the target allows, or, when a
    row is NaN or fully masked, a FloatingPointError, never a silently wrong token."""
    values = data.draw(st.lists(extreme_logits, min_size=(k + 1) * vocab, max_size=(k + 1) * vocab))
    logits = torch.tensor(values, dtype=torch.float32).reshape(k + 1, vocab)
    if inject_nan:
        logits[data.draw(st.integers(0, k)), data.draw(st.integers(0, vocab - 1))] = float("nan")
    drafts = torch.tensor(data.draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k)), dtype=torch.long)
    verifier = Verifier(rule, 0.5, measure, sampling)  # type: ignore[arg-type]
    processed = process_logits(logits, sampling)
    broken = bool(torch.isnan(processed).any()) or not bool(torch.isfinite(processed.max(-1).values).all())
    try:
        verdict = verifier.verify(logits, chain(drafts), PositionNoise(0, vocab))
    except FloatingPointError:
        assert broken
        return
    assert not broken
    n = accepted(verdict)
    assert 0 <= n <= k and verdict.accepted_positions == list(range(n)) and 0 <= verdict.next_token < vocab
    assert torch.isfinite(processed[n, verdict.next_token]) or sampling.greedy


@pytest.mark.parametrize("vocab", [7, 4099, 49152])
def test_strict_greedy_takes_the_first_of_tied_maxima_like_argmax(vocab):
    """The greedy choice is the first index of the row's maximum, as transformers' argmax: on a
    coarse grid every row has ties, at every vocabulary size the CPU kernels vectorize differently."""
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randint(0, 4, (5, vocab), generator=generator).float()
    tree = DraftTree.chain(logits.argmax(dim=-1)[:4])  # each draft the argmax of the row before it
    verdict = Verifier().verify(logits, tree)
    assert verdict.accepted_positions == [0, 1, 2, 3] and verdict.next_token == int(logits[4].argmax())
    top1, _, _, _ = top_two(logits)
    assert torch.equal(top1, logits.argmax(dim=-1))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([-2.0, -1.0, 0.0, 0.5, 3.0, math.inf, -math.inf, math.nan]), min_size=2, max_size=9),
       st.sampled_from([None, 3]))
def test_a_plain_greedy_round_takes_the_batched_rules_token(values, top_k):
    """Strict greedy with no drafts skips the batched rules: the same token (ties included), the
    same empty verdict, and the same refusal of a row with NaN or an infinite maximum."""
    logits = torch.tensor([values])
    verifier = Verifier(sampling=SamplingParams(0.0, top_k=top_k or 0))
    empty = DraftTree.empty(torch.device("cpu"))
    batch = DraftBatch.of_trees([empty], logits.device)
    try:
        expected = verifier.verify_batch(logits, batch)[0]
    except FloatingPointError as error:
        with pytest.raises(FloatingPointError, match=str(error)[:30]):
            verifier.verify(logits, empty)
        return
    found = verifier.verify(logits, empty)
    assert (found.accepted_positions, found.next_token, found.relaxed, found.examined, found.low_margin) == (
        expected.accepted_positions, expected.next_token, expected.relaxed, expected.examined, expected.low_margin)


@st.composite
def trees_and_logits(draw):
    """A random draft tree (each node's parent an earlier node or the pending token) over a small
    vocabulary, its drafts often the parent's argmax, and logits with ties (integer values)."""
    size = draw(st.integers(1, 8))
    vocab = draw(st.integers(2, 5))
    parents = [draw(st.integers(-1, node - 1)) for node in range(size)]
    values = draw(st.lists(st.lists(st.integers(-3, 3), min_size=vocab, max_size=vocab),
                           min_size=size + 1, max_size=size + 1))
    logits = torch.tensor(values, dtype=torch.float32)
    argmax = logits.argmax(dim=-1).tolist()
    tokens = [argmax[parent + 1] if draw(st.booleans()) else draw(st.integers(0, vocab - 1)) for parent in parents]
    return DraftTree(torch.tensor(tokens), torch.tensor(parents)), logits


@settings(max_examples=300, deadline=None)
@given(trees_and_logits())
def test_strict_greedy_on_one_tree_is_the_batched_rules_verdict(case):
    """`verify` walks one tree on the host under strict greedy; `verify_batch`, the batched rules,
    must agree on every field, ties included."""
    tree, logits = case
    walked = STRICT.verify(logits, tree)
    batched = STRICT.verify_batch(logits, DraftBatch.of_trees([tree], logits.device))[0]
    assert walked.accepted_positions == batched.accepted_positions
    assert (walked.next_token, walked.relaxed, walked.examined, walked.low_margin) == \
        (batched.next_token, batched.relaxed, batched.examined, batched.low_margin)
