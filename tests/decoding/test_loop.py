"""The decoding loop: losslessness against transformers' own greedy output, stopping, stats,
and the sampling distribution end to end."""

from __future__ import annotations

import random

import pytest
import torch

from mars_cli.decoding.controller import AdaptiveDraftLength
from mars_cli.decoding.cost import CostCurve
from mars_cli.decoding.tree import DraftTree
from mars_cli.decoding.drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter, check_same_vocabulary
from mars_cli.decoding.loop import DecodeSettings, decode
from mars_cli.decoding.sampling import PositionNoise
from mars_cli.decoding.sampling import SamplingParams
from mars_cli.decoding.stats import DecodeStats
from mars_cli.decoding.target import TargetScorer
from mars_cli.decoding.verifiers import Verifier
from mars_cli.errors import UserError
from mars_cli.models import load_model

from ..conftest import EOS_ID


def hf_greedy(target, prompt: list[int], max_new: int, eos: int | None = EOS_ID) -> list[int]:
    ids = torch.tensor([prompt])
    out = target.model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
        min_new_tokens=0 if eos is not None else max_new, eos_token_id=eos, pad_token_id=0,
    )
    return out[0, len(prompt):].tolist()


def run(target, drafter, prompt, max_new, k=4, verifier=Verifier("strict"), noise=None, stats=None):
    tokens: list[int] = []
    scorer = TargetScorer(target, drafter.feature_layers)
    for chunk in decode(scorer, drafter, verifier, prompt, DecodeSettings(max_new, k), noise, stats):
        tokens.extend(chunk)
    return tokens


class ScriptedDrafter(Drafter):
    """Proposes from a fixed continuation, optionally corrupting chosen positions: lets a test
    build drafts that are always right, always wrong or partly right."""

    name = "scripted"

    def __init__(self, prompt_len: int, continuation: list[int], vocab: int, wrong_share: float = 0.0,
                 always_wrong: bool = False) -> None:
        self.prompt_len, self.continuation, self.vocab = prompt_len, continuation, vocab
        self.wrong_share, self.always_wrong = wrong_share, always_wrong
        self.rng = random.Random(0)

    def reset(self) -> None:
        self.rng = random.Random(0)

    def propose(self, history: torch.Tensor, k: int) -> DraftTree:
        produced = history.shape[0] - self.prompt_len
        tokens = list(self.continuation[produced: produced + k])
        tokens += [3] * (k - len(tokens))  # past the known continuation: arbitrary tokens
        for i in range(len(tokens)):
            if self.always_wrong or self.rng.random() < self.wrong_share:
                tokens[i] = (tokens[i] + 1) % self.vocab
        return DraftTree.chain(torch.tensor(tokens, dtype=torch.long))


def random_prompt(rng: random.Random, vocab: int, length: int) -> list[int]:
    # includes repeats so the n-gram drafter finds matches
    base = [rng.randrange(3, vocab) for _ in range(max(1, length // 2))]
    return (base * 3)[:length]


@pytest.mark.parametrize("seed", range(10))
def test_every_drafter_reproduces_target_greedy_output(tiny_target, tiny_draft, seed):
    rng = random.Random(seed)
    vocab = len(tiny_target.tokenizer)
    prompt = random_prompt(rng, vocab, [1, 2, 5, 17, 40][seed % 5])
    max_new = [1, 3, 20, 45][seed % 4]
    expected = hf_greedy(tiny_target, prompt, max_new)
    for k in (1, 2, 4, 7):
        drafters = [
            NoDrafter(tiny_target.device),
            NgramDrafter(tiny_target.device),
            ModelDrafter(tiny_draft, SamplingParams(0.0)),
            ScriptedDrafter(len(prompt), expected, vocab),
            ScriptedDrafter(len(prompt), expected, vocab, always_wrong=True),
            ScriptedDrafter(len(prompt), expected, vocab, wrong_share=0.3),
        ]
        for drafter in drafters:
            assert run(tiny_target, drafter, prompt, max_new, k) == expected, (drafter.name, k)


@pytest.mark.parametrize("seed", range(4))
def test_adaptive_draft_length_stays_lossless(tiny_target, seed):
    """`--num-draft auto` changes only how many tokens are drafted each round, never the output."""
    rng = random.Random(seed)
    vocab = len(tiny_target.tokenizer)
    prompt = random_prompt(rng, vocab, 17)
    expected = hf_greedy(tiny_target, prompt, 40)
    for costs in ({w: 50.0 * w for w in range(1, 10)}, {w: 50.0 + w for w in range(1, 10)}):
        chooser = AdaptiveDraftLength(CostCurve({}, costs), max_k=8)
        for drafter in (NgramDrafter(tiny_target.device),
                        ScriptedDrafter(len(prompt), expected, vocab, wrong_share=0.3)):
            tokens: list[int] = []
            settings = DecodeSettings(40, 8, adaptive_draft=True)
            for chunk in decode(TargetScorer(tiny_target), drafter, Verifier("strict"), prompt, settings,
                                draft_length=chooser):
                tokens.extend(chunk)
            assert tokens == expected, (drafter.name, costs[2])
        if costs[2] < 2 * costs[1]:  # flat widths: it drafted, and learned from the rounds it saw
            assert sum(chooser.examined) > 0
        # (steep widths: a width-2 round costs two plain steps, so it mostly decodes plainly)


def test_always_right_drafts_are_all_accepted(tiny_target):
    prompt = [5, 9, 14, 20]
    target = EosTarget(tiny_target, -1)  # no EOS: every round runs to its full length
    expected = hf_greedy(tiny_target, prompt, 30, eos=None)
    stats = DecodeStats()
    drafter = ScriptedDrafter(len(prompt), expected, len(tiny_target.tokenizer))
    assert run(target, drafter, prompt, 30, k=4, stats=stats) == expected
    summary = stats.summary()
    assert stats.accepted == stats.drafted and stats.rounds == 6  # 5 + 5 + ... = 30
    assert summary["mean_accepted"] == pytest.approx(5.0)
    assert summary["per_position_acceptance"] == [1.0] * 4


def test_stats_for_plain_decoding(tiny_target):
    stats = DecodeStats()
    tokens = run(tiny_target, NoDrafter(tiny_target.device), [4, 5, 6], 12, stats=stats)
    summary = stats.summary()
    assert summary["rounds"] == summary["new_tokens"] == len(tokens)
    assert summary["mean_accepted"] == 1.0 and summary["drafted"] == 0
    assert summary["mean_logprob"] < 0
    assert sum(summary["time_s"].values()) == pytest.approx(summary["wall_s"], rel=1e-6)


class EosTarget:
    """Wraps a target so that a chosen token id counts as EOS: lets a test place EOS mid-block."""

    def __init__(self, target, eos: int) -> None:
        self._target, self._eos = target, eos

    def __getattr__(self, name):
        return getattr(self._target, name)

    @property
    def eos_token_ids(self):
        return {self._eos}


def test_block_never_emits_past_eos_or_budget(tiny_target):
    prompt = [7, 8, 9, 10]
    free_run = hf_greedy(tiny_target, prompt, 40)
    eos = free_run[5]
    cut = free_run.index(eos) + 1
    target = EosTarget(tiny_target, eos)
    drafter = ScriptedDrafter(len(prompt), free_run, len(tiny_target.tokenizer))
    stats = DecodeStats()
    assert run(target, drafter, prompt, 40, k=7, stats=stats) == free_run[:cut]
    assert stats.finish_reason == "eos"
    for budget in (1, 2, 6, 9):
        drafter = ScriptedDrafter(len(prompt), free_run, len(tiny_target.tokenizer))
        stats = DecodeStats()
        out = run(tiny_target, drafter, prompt, budget, k=7, stats=stats)
        assert out == free_run[:budget] and stats.new_tokens == len(out)


def test_stop_strings_end_generation(tiny_target):
    prompt = tiny_target.tokenizer.encode("abc abc ab")
    free_run = run(tiny_target, NoDrafter(tiny_target.device), prompt, 30)
    text = tiny_target.tokenizer.decode(free_run)
    stop = text[3:5] if len(text) >= 5 else text
    tokens: list[int] = []
    stats = DecodeStats()
    settings = DecodeSettings(30, 4, (stop,))
    for chunk in decode(TargetScorer(tiny_target), NgramDrafter(tiny_target.device), Verifier(), prompt, settings,
                        None, stats):
        tokens.extend(chunk)
    assert stop in tiny_target.tokenizer.decode(tokens)
    assert tokens == free_run[: len(tokens)] and stats.finish_reason in ("stop_string", "eos")


def test_ngram_proposes_continuation_of_most_recent_match():
    drafter = NgramDrafter(torch.device("cpu"), max_ngram=2, min_ngram=1)
    history = torch.tensor([1, 2, 3, 9, 1, 2, 4, 5, 7, 1, 2])
    assert drafter.propose(history, 3).tokens.tolist() == [4, 5, 7]
    assert drafter.propose(torch.tensor([5, 6, 8]), 3).tokens.numel() == 0


def test_seeded_sampling_is_reproducible(tiny_target, tiny_draft):
    sampling = SamplingParams(0.9, top_k=20)
    outputs = []
    for _ in range(2):
        drafter = ModelDrafter(tiny_draft, sampling)
        outputs.append(run(tiny_target, drafter, [4, 5, 6], 25, verifier=Verifier("strict", sampling=sampling),
                           noise=PositionNoise(5, tiny_target.vocab_size)))
    assert outputs[0] == outputs[1]


def test_sampled_first_token_follows_target_distribution(tiny_target, tiny_draft):
    """End to end through the loop with a model drafter: the first generated token's empirical
    distribution matches the target's exact softmax (total variation within tolerance)."""
    sampling = SamplingParams(1.0)
    prompt = [5, 6, 7]
    with torch.no_grad():
        p = torch.softmax(tiny_target.model(torch.tensor([prompt])).logits[0, -1].float(), -1)
    draws, counts = 1500, torch.zeros_like(p)
    verifier = Verifier("strict", sampling=sampling)
    drafter = ModelDrafter(tiny_draft, sampling)
    for draw in range(draws):
        noise = PositionNoise(draw, tiny_target.vocab_size)
        first = run(tiny_target, drafter, prompt, 2, k=3, verifier=verifier, noise=noise)[0]
        counts[first] += 1
    assert_follows(counts, p, draws)


def assert_follows(counts: torch.Tensor, p: torch.Tensor, draws: int) -> None:
    """Total variation between the empirical and the exact distribution within sampling noise."""
    tv = 0.5 * (counts / draws - p).abs().sum().item()
    bound = 0.5 * torch.sqrt(p * (1 - p) / draws).sum().item()
    assert tv < 2.5 * bound + 0.01, (tv, bound)


def test_draft_model_with_other_vocabulary_is_refused(tiny_target, tiny_other_vocab_dir):
    other = load_model(str(tiny_other_vocab_dir), device="cpu")
    with pytest.raises(UserError, match="vocabulary"):
        check_same_vocabulary(tiny_target, other)


def test_model_drafter_rolls_back_its_cache(tiny_target, tiny_draft):
    drafter = ModelDrafter(tiny_draft, SamplingParams(0.0))
    history = torch.tensor([4, 5, 6, 7])
    drafter.propose(history, 4)
    assert len(drafter.cache) == 4 + 3
    drafter.commit(5)
    assert len(drafter.cache) == 5


def test_padded_rounds_feed_k_plus_one_and_change_nothing(tiny_target, monkeypatch):
    """Short drafts are padded to k + 1 target positions (cheaper on CPU than odd widths); the
    padding is scored and dropped, so tokens and stats are those of the unpadded loop."""
    from mars_cli.decoding import kv, loop

    widths: list[int] = []
    original = kv.KVCache.forward

    def spy(self, input_ids, hidden=False, **extra):
        widths.append(input_ids.shape[1])
        return original(self, input_ids, hidden, **extra)

    monkeypatch.setattr(kv.KVCache, "forward", spy)
    prompt = [5, 9, 14, 20, 5, 9, 14]
    expected = hf_greedy(tiny_target, prompt, 30)
    results = {}
    for pad in (True, False):
        if not pad:  # every round fed at its own width
            monkeypatch.setattr(loop, "padded_width", lambda tree, depth, tree_tokens: tree.size + 1)
        widths.clear()
        stats = DecodeStats()
        settings = DecodeSettings(30, 4)
        tokens = []
        drafter = ShortScriptedDrafter(len(prompt), expected, len(tiny_target.tokenizer), wrong_share=0.3)
        scorer = TargetScorer(tiny_target)
        for chunk in decode(scorer, drafter, Verifier("strict"), prompt, settings, None, stats):
            tokens.extend(chunk)
        results[pad] = (tokens, stats.drafted, stats.accepted, stats.rounds, list(widths[1:]))
    assert results[True][:4] == results[False][:4] and results[True][0] == expected
    # the last rounds draft less (the budget), so their padded width is smaller too
    assert set(results[True][4][:-3]) <= {1, 5}
    assert len(set(results[False][4])) > len(set(results[True][4][:-3]))


class ShortScriptedDrafter(ScriptedDrafter):
    """Proposes between 0 and k of the scripted tokens (a varying draft length)."""

    def propose(self, history: torch.Tensor, k: int) -> DraftTree:
        full = super().propose(history, k)
        return full.first(self.rng.randrange(0, k + 1))


def test_bfloat16_is_the_only_difference(tiny_dir, tiny_target):
    """Strict greedy is exact with respect to the verification pass's logits in any dtype: every
    emitted token is the argmax of the logits that scored it. In float32 the same prompts then
    come out identical to plain decoding; in bfloat16 a (k + 1)-wide pass may round differently
    from one-wide ones, which is the only way its output can differ (docs/method.md)."""
    from mars_cli.models import load_model

    rng = random.Random(7)
    vocab = len(tiny_target.tokenizer)
    prompts = [random_prompt(rng, vocab, length) for length in (5, 17, 40)]
    bf16 = load_model(str(tiny_dir), device="cpu", dtype="bfloat16")
    for target in (tiny_target, bf16):
        for prompt in prompts:
            plain = run(target, NoDrafter(target.device), prompt, 30)
            emitted, argmaxes = [], []

            def observe(logits: torch.Tensor) -> None:
                argmaxes.extend(logits.argmax(dim=-1).tolist())

            scorer = TargetScorer(target)
            drafter = ScriptedDrafter(len(prompt), plain, vocab, wrong_share=0.3)
            for chunk in decode(scorer, drafter, Verifier("strict"), prompt, DecodeSettings(30, 4), observe=observe):
                emitted.extend(chunk)
            assert emitted == argmaxes  # exact w.r.t. the verification logits, whatever the dtype
            if target.dtype == torch.float32:
                assert emitted == plain  # and in float32 that is the plain greedy output
