"""The static cache and compiled forwards (`TargetScorer(static_cache=True, compile=True)`):
token-for-token the same decoding as the growing cache, in float32, with every kind of round
(plain, chain drafts, padded, partly accepted, several sequences through one scorer); `keep`
gathers as a fresh forward would; a sequence that does not fit fails clearly; `--compile on`
where torch cannot compile is a one-line error."""

from __future__ import annotations

import random
import time

import pytest
import torch

from mars_cli.decoding import kv
from mars_cli.decoding.drafters import ModelDrafter, NgramDrafter, NoDrafter
from mars_cli.decoding.kv import StaticCacheUnsupported, StaticKVCache
from mars_cli.decoding.loop import DecodeSettings, decode
from mars_cli.decoding.sampling import SamplingParams
from mars_cli.decoding.tree import DraftTree
from mars_cli.decoding.target import LAST_LAYER, TargetScorer
from mars_cli.decoding.verifiers import Verifier
from mars_cli.errors import UserError

from .test_loop import ScriptedDrafter, ShortScriptedDrafter, hf_greedy, random_prompt
from .test_scorer import PREFIX, fresh_cache, next_logits


def decode_all(scorer, drafter, prompts, max_new, k):
    """Decode each prompt in turn through one scorer."""
    outputs = []
    for prompt in prompts:
        tokens: list[int] = []
        for chunk in decode(scorer, drafter, Verifier("strict"), prompt, DecodeSettings(max_new, k)):
            tokens.extend(chunk)
        outputs.append(tokens)
    return outputs


def drafters_for(target, draft, prompt, expected):
    vocab = len(target.tokenizer)
    return [
        NoDrafter(target.device),
        NgramDrafter(target.device),
        ModelDrafter(draft, SamplingParams(0.0)),
        ScriptedDrafter(len(prompt), expected, vocab, wrong_share=0.3),  # partial acceptance, rollback
        ShortScriptedDrafter(len(prompt), expected, vocab, wrong_share=0.3),  # short drafts: padded
    ]


@pytest.mark.parametrize("seed", range(4))
def test_static_cache_decodes_as_the_growing_cache(tiny_target, tiny_draft, seed):
    """One static scorer serves every drafter and prompt in turn (reset in place between
    sequences); each output is the growing cache's (transformers' greedy output, which
    tests/decoding/test_loop.py checks the growing cache against)."""
    rng = random.Random(seed)
    vocab = len(tiny_target.tokenizer)
    prompts = [random_prompt(rng, vocab, n) for n in (1, 9, 23)]
    max_new = [1, 12, 33, 45][seed]
    expected = {tuple(p): hf_greedy(tiny_target, p, max_new) for p in prompts}
    for k in (1, 3, 6):
        scorer = TargetScorer(tiny_target, static_cache=True, headroom=max_new + k + 2)
        for prompt in prompts:
            for drafter in drafters_for(tiny_target, tiny_draft, prompt, expected[tuple(prompt)]):
                assert decode_all(scorer, drafter, [prompt], max_new, k) == [expected[tuple(prompt)]], (drafter.name, k)
                assert scorer.kind == "static"


def test_static_cache_hands_over_the_same_features(tiny_target):
    """A feature-reading drafter gets the same rows from either cache (scripted drafts, partial
    acceptance, padded rounds)."""
    prompt = [5, 9, 14, 20, 5, 9, 14]
    expected = hf_greedy(tiny_target, prompt, 30)
    handed: dict[bool, list[torch.Tensor]] = {}
    for static in (False, True):
        drafter = ShortScriptedDrafter(len(prompt), expected, len(tiny_target.tokenizer), wrong_share=0.3)
        drafter.feature_layers = LAST_LAYER
        seen: list[torch.Tensor] = []
        drafter.observe_features = seen.append  # type: ignore[method-assign]
        scorer = TargetScorer(tiny_target, LAST_LAYER, static_cache=static, headroom=40)
        assert decode_all(scorer, drafter, [prompt], 30, 4) == [expected]
        handed[static] = seen
    assert len(handed[False]) == len(handed[True])
    for dynamic, static in zip(handed[False], handed[True]):
        torch.testing.assert_close(static, dynamic, rtol=1e-5, atol=1e-5)


def widths_fed(monkeypatch) -> list[int]:
    widths: list[int] = []
    original = StaticKVCache.forward

    def spy(self, input_ids, hidden=False, **extra):
        widths.append(input_ids.shape[1])
        return original(self, input_ids, hidden, **extra)

    monkeypatch.setattr(StaticKVCache, "forward", spy)
    return widths


def test_compiled_scorer_feeds_only_widths_it_has_compiled(tiny_target, monkeypatch):
    """With `compile`, drafts are always padded and a narrower round reuses a wider graph, so the
    widths fed are 1 and k + 1 only, even as the budget shortens the last drafts. (The compiled
    function is replaced by the eager forward here: this test is about shapes, not inductor.)"""
    monkeypatch.setattr("mars_cli.decoding.target.compile_forward", lambda model, select, cuda_graphs: eager_step(model))
    fed: list[int] = []
    original = StaticKVCache.call

    def spy(self, function, input_ids, layout=None):
        fed.append(input_ids.shape[1])
        return original(self, function, input_ids, layout)

    monkeypatch.setattr(StaticKVCache, "call", spy)
    prompt = [5, 9, 14, 20, 5, 9, 14]
    expected = hf_greedy(tiny_target, prompt, 30)
    drafter = ShortScriptedDrafter(len(prompt), expected, len(tiny_target.tokenizer), wrong_share=0.3)
    scorer = TargetScorer(tiny_target, compile=True, headroom=40)
    assert decode_all(scorer, drafter, [prompt, prompt], 30, 4) == [expected, expected]
    assert scorer.kind == "compiled" and set(fed) == {1, 5}


def eager_step(model):
    keyword = kv._cache_keyword(type(model))

    def forward(cache, input_ids, position_ids, attention_mask=None):
        output = model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=True,
                       **{keyword: cache})
        return output.logits, None

    return forward


@torch.inference_mode()
def test_static_keep_gathers_a_branch_of_a_tree(tiny_target):
    """As tests/decoding/test_scorer.py's tree test, in a static cache: keeping a and c (siblings b and c
    after a) leaves what a fresh forward over prefix + a + c would, and the next step agrees."""
    cache = StaticKVCache(tiny_target.model, 32)
    cache.forward(torch.tensor([PREFIX]))
    p = len(PREFIX)
    a, b, c = 3, 4, 6
    allowed = torch.ones(3, 32, dtype=torch.bool)
    allowed[:, p + 3:] = False  # the rest of the static cache
    allowed[0, p + 1: p + 3] = False
    allowed[1, p + 2] = False
    allowed[2, p + 1] = False
    mask = torch.zeros(1, 1, 3, 32, dtype=tiny_target.dtype)
    mask.masked_fill_(~allowed, torch.finfo(tiny_target.dtype).min)
    cache.forward(torch.tensor([[a, b, c]]), attention_mask=mask, position_ids=torch.tensor([[p, p + 1, p + 1]]))

    cache.keep(list(range(p)) + [p, p + 2])
    assert len(cache) == p + 2 and int(cache.cache.get_seq_length()) == p + 2
    reference = fresh_cache(tiny_target, PREFIX + [a, c])
    for static, grown in zip(cache.cache.layers, reference.cache.layers):
        torch.testing.assert_close(static.keys[..., : p + 2, :], grown.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(static.values[..., : p + 2, :], grown.values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.forward(torch.tensor([[8]])).logits[0, -1], next_logits(tiny_target, reference, 8),
                               rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_static_keep_a_prefix_and_reset_keep_the_tensors_in_place(tiny_target):
    cache = StaticKVCache(tiny_target.model, 16)
    cache.forward(torch.tensor([PREFIX + [3, 4, 6]]))
    addresses = [layer.keys.data_ptr() for layer in cache.cache.layers]
    cache.keep(range(len(PREFIX) + 1))
    reference = fresh_cache(tiny_target, PREFIX + [3])
    torch.testing.assert_close(cache.forward(torch.tensor([[8]])).logits[0, -1], next_logits(tiny_target, reference, 8),
                               rtol=1e-5, atol=1e-5)
    cache.reset()
    assert len(cache) == 0 and int(cache.cache.get_seq_length()) == 0
    cache.forward(torch.tensor([PREFIX]))
    assert [layer.keys.data_ptr() for layer in cache.cache.layers] == addresses
    with pytest.raises(ValueError, match="do not fit"):
        cache.forward(torch.tensor([list(range(3, 15))]))  # 5 + 12 > 16


def test_a_sequence_longer_than_the_static_cache_fails_clearly(tiny_target, capsys):
    scorer = TargetScorer(tiny_target, static_cache=True, headroom=10, max_length=32)
    scorer.start(torch.tensor(PREFIX))  # 5 + 10 fits
    with pytest.raises(UserError, match="at most 32"):
        scorer.start(torch.arange(3, 30))  # 27 + 10 does not
    # a caller that feeds one round at a time (a cost measurement) asks for less room
    scorer = TargetScorer(tiny_target, static_cache=True, headroom=300, max_length=64)
    with pytest.raises(UserError, match="at most 64"):
        scorer.start(torch.tensor(PREFIX))
    scorer.start(torch.tensor(PREFIX), room=8)
    assert scorer.kind == "static" and scorer.cache.capacity == 64
    # and a round past the room it was sized for is refused, never written past the end
    scorer = TargetScorer(tiny_target, static_cache=True, headroom=2, max_length=8)
    scorer.start(torch.tensor(PREFIX))
    with pytest.raises(UserError, match="outgrew"):
        scorer.score(torch.tensor([3]), DraftTree.chain(torch.tensor([4, 6, 7])), width=4)
    # with `fallback` the long sequence runs on the growing cache, with one note
    scorer = TargetScorer(tiny_target, static_cache=True, headroom=10, max_length=32, fallback=True)
    scorer.start(torch.arange(3, 30))
    assert scorer.kind == "dynamic" and "static cache holds at most 32" in capsys.readouterr().err
    scorer.start(torch.tensor(PREFIX))
    assert scorer.kind == "static"


@pytest.fixture(scope="module")
def tiny_gemma3():
    """A tiny Gemma 3 text model: sliding-window layers (window 24) between global ones."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from mars_cli.models import LoadedModel

    from ..conftest import EOS_ID, build_tokenizer

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=24,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                              max_position_embeddings=256, eos_token_id=EOS_ID, pad_token_id=0, bos_token_id=1)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return LoadedModel(spec="tiny-gemma3", source="test", model=model, tokenizer=tokenizer, device=torch.device("cpu"),
                       dtype=torch.float32)


def test_sliding_window_layers_work_within_their_window(tiny_gemma3):
    prompt = [5, 9, 14, 20, 5, 9, 14]
    expected = decode_all(TargetScorer(tiny_gemma3), NoDrafter(tiny_gemma3.device), [prompt], 12, 1)
    for drafter in (NoDrafter(tiny_gemma3.device), NgramDrafter(tiny_gemma3.device)):
        scorer = TargetScorer(tiny_gemma3, static_cache=True, headroom=16)  # 6 + 16 <= 24
        assert decode_all(scorer, drafter, [prompt, prompt], 12, 3) == expected * 2
        assert scorer.kind == "static"
    with pytest.raises(StaticCacheUnsupported, match="sliding window"):
        StaticKVCache(tiny_gemma3.model, 25)
    with pytest.raises(UserError, match="sliding window"):
        TargetScorer(tiny_gemma3, static_cache=True, headroom=30).start(torch.tensor(prompt))


@pytest.mark.parametrize("command", ["generate", "profile", "eval", "calibrate"])
def test_compile_on_without_a_compiler_is_one_line(capsys, monkeypatch, tiny_dir, command):
    from ..cli.errors_helpers import one_line_error

    monkeypatch.setattr("mars_cli.decoding.target.compile_unavailable",
                        lambda device: "torch.compile on CPU needs a C++ compiler (g++ or clang++) and none was found")
    args = [command] + (["hello"] if command == "generate" else []) + ["--target", str(tiny_dir), "--device", "cpu",
                                                                       "--compile", "on"]
    one_line_error(capsys, args, "--compile on: torch.compile on CPU needs a C++ compiler")


def test_compile_auto_falls_back_quietly_and_config_says_so(monkeypatch, tiny_target):
    from mars_cli.options import DecodingOptions
    from mars_cli.session import Session

    monkeypatch.setattr("mars_cli.decoding.target.compile_unavailable", lambda device: "no compiler")
    session = Session(DecodingOptions.of(compile="auto", max_new_tokens=4), target=tiny_target)
    assert session.config()["compile"] == "auto" and session.config()["compiled"] is False
    with pytest.raises(UserError, match="--compile ON: expected"):
        Session(DecodingOptions.of(compile="ON", max_new_tokens=4), target=tiny_target)


def test_compiled_forwards_decode_as_eager(tiny_target):
    """Real `torch.compile` (inductor; needs a C++ compiler) on the tiny model: plain and
    drafted rounds, two sequences through one scorer, same tokens as the growing cache."""
    from mars_cli.decoding.target import compile_unavailable, resolve_compile

    problem = compile_unavailable(tiny_target.device)
    if problem:  # without a compiler the promise is a clear refusal instead
        with pytest.raises(UserError, match="--compile on: "):
            resolve_compile("on", tiny_target)
        assert resolve_compile("auto", tiny_target) is False
        return
    prompt = [5, 9, 14, 20, 5, 9, 14, 20, 5]
    other = [7, 8, 9, 7, 8, 9, 7]
    expected = [hf_greedy(tiny_target, p, 16) for p in (prompt, other)]
    import torch._dynamo.utils

    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    scorer = TargetScorer(tiny_target, compile=True, headroom=24)
    start = time.perf_counter()
    drafter = ScriptedDrafter(len(prompt), expected[0], len(tiny_target.tokenizer), wrong_share=0.3)
    assert decode_all(scorer, drafter, [prompt], 16, 3) == expected[:1]
    assert decode_all(scorer, NgramDrafter(tiny_target.device), [prompt, other], 16, 3) == expected
    assert scorer.kind == "compiled" and scorer.compiled_widths == {1, 4}
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 2  # one per width, no recompiles
    print(f"compiled decoding with two widths: {time.perf_counter() - start:.1f} s")


def test_compiled_draft_model_drafts_what_the_eager_one_drafts(tiny_target, tiny_draft):
    """`--compile on` with a draft model: its drafting steps (one token, a tree level's frontier)
    run through the compiled forward on a static cache that starts small and grows (re-reading
    the history): every round's chain or tree equals the eager draft model's, across sequences."""
    from mars_cli.decoding.target import compile_unavailable, resolve_compile
    from mars_cli.decoding.tree import TreeShape

    if compile_unavailable(tiny_draft.device):  # without a compiler the promise is a clear refusal
        with pytest.raises(UserError, match="--compile on: "):
            resolve_compile("on", tiny_draft)
        return
    rng = random.Random(11)
    vocab = len(tiny_target.tokenizer)
    for shape in (TreeShape(1, 0), TreeShape(3, 8)):
        eager = ModelDrafter(tiny_draft, SamplingParams(0.0), shape)
        compiled = ModelDrafter(tiny_draft, SamplingParams(0.0), shape, compile=True)
        assert compiled.compiled and not eager.compiled
        for length in (5, 40, 254, 7):  # 254 outgrows the first block: a larger cache, history re-read
            history = torch.tensor(random_prompt(rng, vocab, length))
            proposals = []
            for drafter in (eager, compiled):
                drafter.reset()
                first = drafter.propose(history[: length - 2], 4)
                drafter.commit(length - 3)
                second = drafter.propose(history, 4)  # after a rollback: the cache cut back, then read on
                proposals.append([(t.tokens.tolist(), t.parents.tolist()) for t in (first, second)])
            assert proposals[0] == proposals[1], (shape, length)
        assert compiled.cache.capacity == 512


def test_a_compiled_draft_model_past_its_sliding_window_drafts_eagerly(tiny_gemma3, capsys):
    """A draft model with sliding-window layers gets a static cache only within its window (24
    here: not a whole block of 256, so exactly what is needed); past it the drafter says so once
    and drafts eagerly on a growing cache, proposing what the eager drafter proposes."""
    from mars_cli import notes
    from mars_cli.decoding.target import compile_unavailable, resolve_compile

    if compile_unavailable(tiny_gemma3.device):  # without a compiler the promise is a clear refusal
        with pytest.raises(UserError, match="--compile on: "):
            resolve_compile("on", tiny_gemma3)
        return
    notes._SHOWN.clear()
    vocab = len(tiny_gemma3.tokenizer)
    history = torch.tensor(random_prompt(random.Random(4), vocab, 40))
    eager = ModelDrafter(tiny_gemma3, SamplingParams(0.0))
    compiled = ModelDrafter(tiny_gemma3, SamplingParams(0.0), compile=True)
    for length in (12, 16, 36):  # 12 + 3 drafts fit the window; 36 does not
        proposals = []
        for drafter in (eager, compiled):
            drafter.commit(length - 4)  # the last round's drafts rolled back
            proposals.append(drafter.propose(history[:length], 3).tokens.tolist())
        assert proposals[0] == proposals[1] and len(proposals[0]) == 3, length
        if length < 36:
            assert isinstance(compiled.cache, StaticKVCache) and compiled.cache.capacity <= 24
    assert not isinstance(compiled.cache, StaticKVCache) and compiled._step is None
    assert capsys.readouterr().err.count("do not fit a static cache") == 1
