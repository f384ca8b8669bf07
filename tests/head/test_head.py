"""The draft head: training/drafting equivalence, losslessness, the vocabulary subset, files,
training, and the CLI around it. Tiny random models only; no file comes from the network."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from mars_cli.decoding.sampling import SamplingParams
from mars_cli.decoding.verifiers import Verifier
from mars_cli.errors import UserError
from mars_cli.head.data import Sequence, extract_features, generate
from mars_cli.decoding.tree import TreeShape
from mars_cli.head.drafter import STATIC_HEAD_BLOCK, HeadDrafter, load_head
from mars_cli.head.model import DraftHead, HeadCache, HeadConfig
from mars_cli.head.train import TrainSettings, head_loss, held_out_acceptance, make_batch, train, vocabulary_subset

from ..decoding.test_loop import assert_follows, hf_greedy, random_prompt, run


def random_head(target, vocab_ids: torch.Tensor | None = None, seed: int = 0) -> DraftHead:
    torch.manual_seed(seed)
    width = target.model.get_output_embeddings().weight.shape[0]
    ids = torch.arange(width) if vocab_ids is None else vocab_ids
    config = HeadConfig.for_target(target.model, target=target.spec, target_fingerprint=target.fingerprint)
    head = DraftHead(config, ids)
    with torch.no_grad():  # weights a saved file reproduces exactly
        for parameter in head.parameters():
            parameter.copy_((parameter * 3).half().float())
    return head.attach(target.model).eval()


def target_features(target, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = target.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0]


def drafts_for(head: DraftHead, target, prompt: list[int], k: int) -> list[int]:
    drafter = HeadDrafter(head, target, SamplingParams(0.0))
    drafter.reset()
    drafter.observe_features(target_features(target, prompt[:-1]))
    return drafter.propose(torch.tensor(prompt), k).tokens.tolist()


def test_unrolled_training_passes_equal_incremental_drafting(tiny_target):
    """Pass d of the training unroll at pair i must be exactly draft step d after true pairs up
    to i-d+1: otherwise the held-out figure and the training signal describe another drafter."""
    head = random_head(tiny_target)
    ids = random_prompt(random.Random(3), len(tiny_target.tokenizer), 14)
    assert_unroll_matches_drafting(head, target_features(tiny_target, ids), torch.tensor(ids), depth=3)


def assert_unroll_matches_drafting(head, feats: torch.Tensor, tokens: torch.Tensor, depth: int) -> None:
    """Every pass of `head.unrolled` against step-by-step drafting from a fresh cache."""
    with torch.no_grad():
        passes = head.unrolled(feats[None, :-1], tokens[None, 1:], depth)
        for m in range(0, tokens.numel() - depth - 1):
            cache = HeadCache()
            out = head.step(feats[: m + 1], tokens[1 : m + 2], cache)[-1:]
            torch.testing.assert_close(out[0], passes[0][0, m], rtol=1e-3, atol=2e-4)
            for d in range(2, depth + 1):
                i = m + d - 1
                out = head.step(out, tokens[i + 1 : i + 2], cache)  # teacher-forced token
                torch.testing.assert_close(out[0], passes[d - 1][0, i], rtol=1e-3, atol=2e-4)


@pytest.mark.parametrize("seed", range(6))
def test_strict_greedy_with_head_reproduces_target(tiny_target, seed):
    rng = random.Random(seed)
    vocab = len(tiny_target.tokenizer)
    prompt = random_prompt(rng, vocab, rng.randint(1, 12))
    max_new = rng.randint(5, 40)
    expected = hf_greedy(tiny_target, prompt, max_new)
    head = random_head(tiny_target, seed=seed)
    for k in (1, 3, 6):
        for confidence in (0.0, 0.3):
            drafter = HeadDrafter(head, tiny_target, SamplingParams(0.0), confidence)
            assert run(tiny_target, drafter, prompt, max_new, k) == expected, (k, confidence)


def test_confidence_stops_drafting_early(tiny_target):
    """The chain stops once the product of the head's own probabilities drops below the bar."""
    from mars_cli.decoding.stats import DecodeStats

    prompt = [5, 9, 14, 20, 7, 5, 9]
    head = random_head(tiny_target)
    drafted = {}
    for confidence in (0.0, 0.2, 0.999):
        stats = DecodeStats()
        run(tiny_target, HeadDrafter(head, tiny_target, SamplingParams(0.0), confidence), prompt, 30, 4,
            stats=stats)
        drafted[confidence] = stats.drafted
    assert drafted[0.0] >= drafted[0.2] >= drafted[0.999] and drafted[0.0] > drafted[0.999]
    # what a round proposes never has a chain probability below the bar
    drafter = HeadDrafter(head, tiny_target, SamplingParams(0.0), 0.2)
    drafter.observe_features(target_features(tiny_target, prompt[:-1]))
    tokens = drafter.propose(torch.tensor(prompt), 4).tokens
    reference = HeadDrafter(head, tiny_target, SamplingParams(0.0), 0.0)
    reference.observe_features(target_features(tiny_target, prompt[:-1]))
    assert tokens.tolist() == reference.propose(torch.tensor(prompt), 4).tokens.tolist()[: tokens.numel()]


def test_head_that_predicts_the_target_is_fully_accepted(tiny_target):
    """A head whose feature prediction is the target's own next feature drafts the target's
    greedy tokens: the loop accepts every draft (checks the feature bookkeeping end to end)."""
    from mars_cli.decoding.stats import DecodeStats

    prompt = [5, 9, 14, 20, 7]
    expected = hf_greedy(tiny_target, prompt, 24, eos=None)
    full = prompt + expected

    class OracleHead(DraftHead):
        def step(self, features, tokens, cache, positions=None, visible=None):  # (a chain: neither)
            start = len(cache)
            cache.append(torch.zeros(1, tokens.shape[0], 1), torch.zeros(1, tokens.shape[0], 1))
            return target_features(tiny_target, full[: start + tokens.shape[0] + 1])[start + 1 :]

    head = random_head(tiny_target)
    oracle = OracleHead(head.config, head.vocab_ids).attach(tiny_target.model)
    from ..decoding.test_loop import EosTarget

    stats = DecodeStats()
    tokens = run(EosTarget(tiny_target, -1), HeadDrafter(oracle, tiny_target, SamplingParams(0.0)),
                 prompt, 24, 4, stats=stats)
    assert tokens == expected
    assert stats.accepted == stats.drafted > 0


def test_sampling_with_head_keeps_the_target_distribution(tiny_target):
    """Sampling with the head's q: the first token's distribution is the target's."""
    from mars_cli.decoding.sampling import PositionNoise

    prompt = [5, 9, 14, 20]
    params = SamplingParams(1.0)
    with torch.no_grad():
        p = torch.softmax(tiny_target.model(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)
    subset = torch.arange(0, p.shape[0], 2)  # half the vocabulary: q is zero elsewhere
    head = random_head(tiny_target, subset)
    counts = torch.zeros_like(p)
    trials = 1500
    drafter = HeadDrafter(head, tiny_target, params)
    for trial in range(trials):
        noise = PositionNoise(trial, tiny_target.vocab_size)
        tokens = run(tiny_target, drafter, prompt, 1, 3, Verifier("strict", sampling=params), noise)
        counts[tokens[0]] += 1
    assert_follows(counts, p, trials)


def test_vocabulary_subset_maps_back_exactly(tiny_target):
    width = tiny_target.model.get_output_embeddings().weight.shape[0]
    permuted = torch.randperm(width, generator=torch.Generator().manual_seed(0))
    plain, shuffled = random_head(tiny_target), random_head(tiny_target, permuted)
    feats = torch.randn(5, plain.config.hidden_size)
    full = feats @ tiny_target.model.get_output_embeddings().weight.T
    torch.testing.assert_close(shuffled.logits(feats), full[:, permuted])
    prompt = [4, 8, 15, 16, 23, 42 % width]
    assert drafts_for(plain, tiny_target, prompt, 5) == drafts_for(shuffled, tiny_target, prompt, 5)
    # a strict subset can only ever draft its own tokens
    small = random_head(tiny_target, permuted[:7])
    assert set(drafts_for(small, tiny_target, prompt, 6)) <= set(permuted[:7].tolist())


def test_vocabulary_subset_ranks_by_frequency_and_keeps_eos():
    seqs = [Sequence(0, [5, 5, 5, 6], [7, 7, 9]), Sequence(1, [6], [5])]
    assert vocabulary_subset(seqs, 3, {2}, 100).tolist() == [2, 5, 6]
    assert vocabulary_subset(seqs, 10, {2}, 100).tolist() == [2, 5, 6, 7, 9]
    assert vocabulary_subset(seqs, 100, {2}, 100).tolist() == list(range(100))


def test_saved_head_reloads_to_identical_drafts(tiny_target, tmp_path):
    head = random_head(tiny_target, torch.randperm(40, generator=torch.Generator().manual_seed(1)))
    path = tmp_path / "head.safetensors"
    head.save(path)
    again = load_head(f"head:{path}", tiny_target)
    prompt = [3, 14, 15, 9, 26, 5]
    assert drafts_for(again, tiny_target, prompt, 6) == drafts_for(head, tiny_target, prompt, 6)
    assert torch.equal(again.vocab_ids, head.vocab_ids)
    assert again.config == head.config


def test_head_for_another_target_is_refused(tiny_target, tiny_draft, tmp_path):
    path = tmp_path / "other.safetensors"
    random_head(tiny_draft).save(path)  # same shapes, another model's fingerprint
    with pytest.raises(UserError, match="trained for"):
        load_head(f"head:{path}", tiny_target)
    (tmp_path / "junk.safetensors").write_bytes(b"not a head")
    with pytest.raises(UserError, match="cannot read draft head"):
        load_head(f"head:{tmp_path / 'junk.safetensors'}", tiny_target)
    with pytest.raises(UserError, match="not found"):
        load_head(f"head:{tmp_path / 'missing.safetensors'}", tiny_target)
    with pytest.raises(UserError, match="no draft head found"):
        load_head("head", tiny_target)


@pytest.fixture(scope="module")
def tiny_data(tiny_target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("head-data")
    prompts = [f"{word} {i}" for i, word in enumerate(["abc", "hello", "zz top", "a b c d", "wow", "x y", "cab"] * 4)]
    sequences = generate(tiny_target, prompts, folder / "gen.jsonl", 24, 6)
    return sequences, extract_features(tiny_target, sequences, folder / "feat.safetensors", 5)


def test_generation_is_the_target_greedy_answer_and_resumes(tiny_target, tiny_data, tmp_path):
    sequences, features = tiny_data
    for sequence in sequences[:3]:
        assert sequence.output_ids == hf_greedy(tiny_target, sequence.prompt_ids, 24)
        torch.testing.assert_close(features[sequence.index].float(),
                                   target_features(tiny_target, sequence.ids).half().float(), rtol=0, atol=2e-3)
    # a killed run: keep two finished lines and a torn one; the rerun completes the rest
    lines = (tmp_path / "gen.jsonl")
    source = sequences[0]
    import json

    lines.write_text(json.dumps({"index": 1, "prompt_ids": sequences[1].prompt_ids,
                                 "output_ids": sequences[1].output_ids}) + "\n" + '{"index": 0, "pro')
    prompts = [f"{word} {i}" for i, word in enumerate(["abc", "hello", "zz top", "a b c d", "wow", "x y", "cab"] * 4)]
    again = generate(tiny_target, prompts, lines, 24, 6)
    assert [s.ids for s in again] == [s.ids for s in sequences]
    assert again[0].ids == source.ids


def test_known_features_are_taken_instead_of_a_forward(tiny_target, tiny_data, tmp_path, monkeypatch):
    """Pooling new answers with old ones: the old answers' features (`known`) are used as they are
    and only the rest go through the target; a known entry of the wrong length is extracted again."""
    sequences, features = tiny_data
    known = {s.index: features[s.index] for s in sequences[:6]}
    known[sequences[6].index] = features[sequences[6].index][:-1]  # stale: one position short
    fed = []
    forward = tiny_target.model.forward

    def counting(*args, **kwargs):
        fed.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny_target.model, "forward", counting)
    pooled = extract_features(tiny_target, sequences, tmp_path / "pooled", 5, known=known)
    assert sum(fed) == len(sequences) - 6
    assert all(pooled[s.index] is known[s.index] for s in sequences[:6])
    for sequence in sequences[6:]:
        assert pooled[sequence.index].shape[0] == len(sequence.ids)
        torch.testing.assert_close(pooled[sequence.index].float(), features[sequence.index].float(), rtol=0, atol=2e-3)
    # the shards written hold all of them: a rerun needs neither `known` nor a forward
    fed.clear()
    again = extract_features(tiny_target, sequences, tmp_path / "pooled", 5)
    assert fed == [] and all(torch.equal(again[s.index], pooled[s.index]) for s in sequences)


def test_training_lowers_the_loss_and_resumes(tiny_target, tiny_data, tmp_path):
    sequences, features = tiny_data
    settings = TrainSettings(architecture="eagle1", epochs=6, batch_size=4, learning_rate=3e-3, depth=2, vocab=30,
                             seed=0, checkpoint_every=5)
    head, held, losses = train(tiny_target, sequences, features, settings, tmp_path / "ckpt", False, {})
    assert len(losses) == 6 * 7  # 25 training prompts in batches of 4
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    assert len(held.per_position) == settings.num_draft and held.rounds > 0
    assert 0.0 <= held.coverage <= 1.0
    # resume from the last checkpoint: nothing left to do, the same weights come back
    again, held_again, losses_again = train(tiny_target, sequences, features, settings, tmp_path / "ckpt", True, {})
    assert losses_again == losses
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))
    assert held_again == held


def test_eagle3_training_lowers_the_loss_and_reloads_to_identical_drafts(tiny_target, tiny_data, tmp_path):
    """EAGLE-3 on a tiny target: fused features, training-time test; the saved directory reloads
    through the same loader as public heads, drafting exactly what the trained head drafts."""
    from mars_cli.head.train import feature_layers

    sequences, _ = tiny_data
    layers = feature_layers("eagle3", tiny_target.model)
    features = extract_features(tiny_target, sequences, tmp_path / "eagle3-features", 5, layers=layers)
    settings = TrainSettings(architecture="eagle3", epochs=6, batch_size=4, learning_rate=3e-3, depth=3, vocab=30,
                             seed=0, checkpoint_every=100)
    head, held, losses = train(tiny_target, sequences, features, settings, tmp_path / "ckpt", False, {})
    # a cross-entropy against the target's soft labels: its floor is their entropy (about 3.2 here)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.25
    assert head.config.draft_vocab_size == 30 and len(held.per_position) == settings.num_draft
    assert sorted(head.vocab_ids.tolist()) == head.vocab_ids.tolist()  # d2t from ascending target ids
    head.save_pretrained(tmp_path / "head")
    again = load_head(f"head:{tmp_path / 'head'}", tiny_target)
    prompt = sequences[3].ids[:9]
    first = HeadDrafter(head.eval(), tiny_target, SamplingParams(0.0))
    second = HeadDrafter(again, tiny_target, SamplingParams(0.0))
    with torch.no_grad():
        out = tiny_target.model(input_ids=torch.tensor([prompt[:-1]]), output_hidden_states=True)
    from mars_cli.decoding.target import select_features

    for drafter in (first, second):
        drafter.observe_features(select_features(out.hidden_states, drafter.feature_layers)[0])
    assert first.propose(torch.tensor(prompt), 4).tokens.tolist() == second.propose(torch.tensor(prompt), 4).tokens.tolist()


def test_sampled_share_answers_some_prompts_by_sampling(tiny_target, tmp_path):
    import json

    from mars_cli.head.data import Answering

    prompts = [f"word {i}" for i in range(10)]
    answering = Answering(max_new_tokens=12, sampled_share=0.5, temperature=1.0, seed=3)
    sequences = generate(tiny_target, prompts, tmp_path / "gen.jsonl", answering, 4)
    modes = {json.loads(line)["index"]: json.loads(line)["mode"] for line in (tmp_path / "gen.jsonl").open()}
    assert sorted(i for i, m in modes.items() if m == "sampled") == [i for i in range(10) if answering.sampled(i)]
    # half of the prompts, spread out, except the held-out one (index 9): held-out answers are greedy
    assert [i for i in range(10) if answering.sampled(i)] == [1, 3, 5, 7]
    for sequence in sequences:
        if not answering.sampled(sequence.index):  # greedy ones are the target's greedy answers
            assert sequence.output_ids == hf_greedy(tiny_target, sequence.prompt_ids, 12)


def test_held_out_acceptance_of_a_perfect_drafter_is_one(tiny_target, tiny_data):
    sequences, features = tiny_data

    class Perfect(DraftHead):
        def unrolled(self, feats, tokens, depth):  # predicts the true next feature at every pass
            nxt = torch.cat([feats[:, 1:], feats[:, -1:]], dim=1)
            return [nxt] * depth

    head = random_head(tiny_target)
    perfect = Perfect(head.config, head.vocab_ids).attach(tiny_target.model)
    held = held_out_acceptance(perfect, sequences, features, 3, 512)
    assert held.rounds > 0 and held.per_position == [1.0, 1.0, 1.0] and held.mean_accepted == 3.0
    # decoding's rounds: every answer token after prefill's first is emitted, k + 1 a round
    after_prefill = [len(s.output_ids) - 1 for s in sequences]
    assert held.decoding_tokens == sum(after_prefill)
    assert held.decoding_rounds == sum(-(-left // 4) for left in after_prefill)


def test_decoding_rounds_start_where_the_last_round_stopped(tiny_target, tiny_data):
    """A random head: decoding's rounds still emit each answer token once, a round never more
    than k + 1, and the figure is their ratio."""
    sequences, features = tiny_data
    held = held_out_acceptance(random_head(tiny_target), sequences, features, 3, 512)
    assert held.decoding_tokens == sum(len(s.output_ids) - 1 for s in sequences)
    assert 0 < held.decoding_rounds <= held.decoding_tokens <= 4 * held.decoding_rounds
    assert held.decoding_tau == held.decoding_tokens / held.decoding_rounds


def test_loss_batch_masks_padding(tiny_target, tiny_data):
    sequences, features = tiny_data
    head = random_head(tiny_target)
    tokens, feats, valid, _ = make_batch(sequences[:2], features, 512)
    loss_alone, _ = head_loss(head, *make_batch(sequences[:1], features, 512)[:3], 2)
    garbage = feats.clone()
    garbage[~valid] = 1e3  # padding must not reach the loss
    tokens_padded = tokens.clone()
    tokens_padded[~valid] = 7
    loss_a, _ = head_loss(head, tokens, feats, valid, 2)
    loss_b, _ = head_loss(head, tokens_padded, garbage, valid, 2)
    torch.testing.assert_close(loss_a, loss_b)
    assert torch.isfinite(loss_alone)


def test_cli_trains_a_head_that_generate_then_finds(capsys, tiny_dir, tmp_path, monkeypatch):
    import json

    from ..cli.test_cli import run_cli

    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MARS_HEADS", str(tmp_path / "heads"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"tell me {w} {i}"}) + "\n"
                               for i, w in enumerate(["abc", "dog", "sun", "xyz", "mop"] * 4)))
    common = ["--target", str(tiny_dir), "--device", "cpu"]
    code, out, err = run_cli(capsys, "train-head", *common, "--prompts", str(prompts), "-n", "12",
                             "--epochs", "2", "--vocab", "40", "--batch-size", "4", "--generate-batch", "8",
                             "--sampled-share", "0.5")
    assert code == 0, err
    assert "expected tau" in out and "draft head written to" in out
    written = Path(os.environ["MARS_HEADS"]) / tiny_dir.name  # an EAGLE-3 head directory
    assert (written / "config.json").is_file() and (written / "model.safetensors").is_file()
    assert not written.with_name(written.name + ".ckpt").exists()
    recipe = json.loads((written / "config.json").read_text())["mars"]["recipe"]
    assert recipe["answers"] == 20 and "sampled" in recipe["data"] and recipe["settings"]["architecture"] == "eagle3"
    # --init fine-tunes that head (found by fingerprint): its vocabulary kept, the source recorded
    tuned = tmp_path / "tuned"
    code, out, err = run_cli(capsys, "train-head", *common, "--prompts", str(prompts), "-n", "12", "--epochs", "1",
                             "--vocab", "10", "--batch-size", "4", "--sampled-share", "0.5", "--init", "head",
                             "--out", str(tuned))
    assert code == 0, err
    tuned_config = json.loads((tuned / "config.json").read_text())
    assert tuned_config["mars"]["recipe"]["fine_tuned_from"] == str(written)
    assert tuned_config["draft_vocab_size"] == json.loads((written / "config.json").read_text())["draft_vocab_size"]
    # `--draft head` (and `auto`) find it by fingerprint; strict greedy output equals plain decoding
    outputs = []
    for draft in ("none", "head", "auto"):
        code, out, err = run_cli(capsys, "generate", "hello abc", *common, "--draft", draft, "-n", "20", "--json")
        assert code == 0, err
        payload = json.loads(out)
        assert payload["config"]["drafter"] == ("none" if draft == "none" else "head")
        assert payload["config"]["draft_head"] == (None if draft == "none" else str(written))
        outputs.append(payload["token_ids"])
    assert outputs[0] == outputs[1] == outputs[2]
    # without a head for the target, `auto` drafts with prompt lookup
    monkeypatch.setenv("MARS_HEADS", str(tmp_path / "no-heads"))
    code, out, err = run_cli(capsys, "generate", "hello abc", *common, "--draft", "auto", "-n", "5", "--json")
    assert code == 0 and json.loads(out)["config"]["drafter"] == "ngram"


@pytest.mark.parametrize("args, message", [
    (["--vocab", "-1"], "--vocab"),
    (["--epochs", "0"], "--epochs"),
    (["--arch", "eagle1", "--out", "head.bin"], "an eagle1 head is a .safetensors file"),
    (["--arch", "eagle9"], "--arch eagle9"),
    (["--sampled-share", "1.5"], "--sampled-share"),
    (["--seed", "18446744073709551617"], "--seed"),
    (["--lr", "0"], "--lr"),
    (["--loss", "kl"], "--loss kl: expected one of soft, hard"),
    (["--depth", "17"], "--depth must be at most 16"),
    (["--init", "head:/nonexistent/head"], "draft head not found: /nonexistent/head"),
    (["--arch", "eagle1", "--init", "head"], "--init fine-tunes an EAGLE-3 head"),
    (["--compile", "fast"], "--compile fast: expected auto, on or off"),
])
def test_cli_train_head_bad_input_is_one_line(capsys, tiny_dir, tmp_path, args, message):
    from ..cli.test_cli import run_cli

    code, _, err = run_cli(capsys, "train-head", "--target", str(tiny_dir), "--device", "cpu", *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_cli_generate_with_a_missing_head_is_one_line(capsys, tiny_dir, tmp_path):
    from ..cli.test_cli import run_cli

    code, _, err = run_cli(capsys, "generate", "hi", "--target", str(tiny_dir), "--device", "cpu",
                           "--draft", "ngram", "--head-confidence", "1.5")
    assert code == 2 and "--head-confidence" in err and len(err.strip().splitlines()) == 1

    code, _, err = run_cli(capsys, "generate", "hi", "--target", str(tiny_dir), "--device", "cpu",
                           "--draft", f"head:{tmp_path / 'none.safetensors'}")
    assert code == 2 and "not found" in err and len(err.strip().splitlines()) == 1


def test_killed_training_resumes_to_the_same_head(tiny_target, tiny_data, tmp_path):
    """A run killed after its step-10 checkpoint, resumed, ends with the weights and losses of a
    run that never stopped (same data order, optimizer state and schedule)."""
    sequences, features = tiny_data
    settings = TrainSettings(architecture="eagle1", epochs=3, batch_size=4, learning_rate=3e-3, depth=2, vocab=30,
                             seed=1, checkpoint_every=5)
    whole, _, whole_losses = train(tiny_target, sequences, features, settings, tmp_path / "a.ckpt", False, {})

    def kill_at_12(step: int, total: int, loss: float) -> None:
        if step == 12:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tiny_target, sequences, features, settings, tmp_path / "b.ckpt", False, {}, kill_at_12)
    resumed, _, resumed_losses = train(tiny_target, sequences, features, settings, tmp_path / "b.ckpt", True, {})
    assert resumed_losses == whole_losses
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()))


def test_resume_continues_only_under_the_recorded_options(tiny_target, tiny_data, tmp_path):
    """The checkpoint records the options (issue 24): the same ones resume to the same head,
    another --lr is refused in one sentence instead of being mixed in."""
    from mars_cli.errors import UserError

    sequences, features = tiny_data
    settings = TrainSettings(architecture="eagle1", epochs=2, batch_size=4, learning_rate=3e-3, depth=2, vocab=30,
                             seed=1, checkpoint_every=5)
    options = {"--lr": 3e-3, "--vocab": 30}
    whole, _, whole_losses = train(tiny_target, sequences, features, settings, tmp_path / "a.ckpt", False, {},
                                   options=options)

    def kill_at_6(step: int, total: int, loss: float) -> None:
        if step == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tiny_target, sequences, features, settings, tmp_path / "b.ckpt", False, {}, kill_at_6, options)
    with pytest.raises(UserError, match=r"--resume: --lr differs from the interrupted run \(0.003 there, 0.01 now\)"):
        train(tiny_target, sequences, features, settings, tmp_path / "b.ckpt", True, {}, None,
              {**options, "--lr": 0.01})
    _, _, resumed_losses = train(tiny_target, sequences, features, settings, tmp_path / "b.ckpt", True, {}, None,
                                 options)
    assert resumed_losses == whole_losses


def test_compiled_head_drafts_what_the_eager_head_drafts(tiny_target):
    """`--compile on` compiles the head's drafting steps on a static head cache (fixed shapes: one
    graph per number of pairs a step reads): chains and trees are the eager head's (float32),
    across sequences, cache lengths and a cache that has to grow."""
    from mars_cli.decoding.target import compile_unavailable, resolve_compile

    if compile_unavailable(tiny_target.device) is not None:  # then --compile on is refused outright
        with pytest.raises(UserError, match="--compile on: "):
            resolve_compile("on", tiny_target)
        return
    head = random_head(tiny_target)
    prompt = [5, 9, 14, 20, 5, 9, 14, 20, 7]
    eager = HeadDrafter(head, tiny_target, SamplingParams(0.0))
    compiled = HeadDrafter(head, tiny_target, SamplingParams(0.0), compile=True)
    for k, length in ((4, 6), (6, 9)):  # another cache length: the same graph
        drafts = []
        for drafter in (eager, compiled):
            drafter.reset()
            drafter.observe_features(target_features(tiny_target, prompt[: length - 1]))
            drafts.append(drafter.propose(torch.tensor(prompt[:length]), k).tokens.tolist())
        assert drafts[0] == drafts[1] and len(drafts[0]) == k
    assert compiled.compiled and not eager.compiled and compiled.cache.capacity == STATIC_HEAD_BLOCK

    shape = TreeShape(3, 10)
    trees = []
    for drafter in (HeadDrafter(head, tiny_target, SamplingParams(0.0), shape=shape),
                    compiled := HeadDrafter(head, tiny_target, SamplingParams(0.0), compile=True, shape=shape)):
        drafter.reset()  # as if a long sequence had gone before: the cache nearly full
        filler = torch.zeros(head.num_kv_heads, STATIC_HEAD_BLOCK - 8, head.head_dim)
        drafter.cache.append(filler, filler)
        drafter.pairs = STATIC_HEAD_BLOCK - 8
        drafter.observe_features(target_features(tiny_target, prompt[:8]))
        tree = drafter.propose(torch.tensor(prompt), 4)
        trees.append((tree.tokens.tolist(), tree.parents.tolist()))
    assert trees[0] == trees[1] and len(trees[0][0]) == 10
    assert compiled.cache.capacity == 2 * STATIC_HEAD_BLOCK  # grown to hold the tree's levels


def test_hard_loss_is_the_cross_entropy_of_the_target_top_token(tiny_target, tiny_data, tmp_path):
    """--loss hard: a one-hot label on the target's top token within the draft vocabulary; soft:
    the target's whole distribution there. Both on the valid pairs only."""
    import torch.nn.functional as F

    from mars_cli.head.train import feature_layers, new_eagle3_head

    sequences, _ = tiny_data
    features = extract_features(tiny_target, sequences[:4], tmp_path / "f", 4,
                                layers=feature_layers("eagle3", tiny_target.model))
    torch.manual_seed(0)
    head = new_eagle3_head(tiny_target, torch.arange(40), {})
    rows = tiny_target.model.get_output_embeddings().weight.detach()[head.vocab_ids].float()
    tokens, feats, valid, _ = make_batch(sequences[:4], features, 512)
    width = head.feature_width
    with torch.no_grad():
        (predicted,) = head.unrolled(feats[:, :-1, :width], tokens[:, 1:], 1)
        pairs = valid[:, 1:]
        target_logits = feats[:, 1:, width:][pairs] @ rows.T
        head_logp = torch.log_softmax(head.logits(predicted[pairs]), dim=-1)
        hard, _ = head_loss(head, tokens, feats, valid, 1, rows, "hard")
        soft, _ = head_loss(head, tokens, feats, valid, 1, rows, "soft")
    expected_hard = F.nll_loss(head_logp, target_logits.argmax(-1))
    expected_soft = -(torch.softmax(target_logits, -1) * head_logp).sum(-1).mean()
    torch.testing.assert_close(hard, expected_hard)
    torch.testing.assert_close(soft, expected_soft)
    assert not torch.allclose(hard, soft)


def test_distillation_lowers_the_held_out_divergence(tiny_target, tiny_data, tmp_path):
    """The soft (distillation) loss brings the head's first-draft distribution closer to the
    target's on held-out answers: KL(target || head) falls well below the untrained head's, and
    below that of the same training on hard labels (which sharpens the head instead)."""
    from mars_cli.head.train import feature_layers, held_out_divergence, new_eagle3_head, split

    sequences, _ = tiny_data
    features = extract_features(tiny_target, sequences, tmp_path / "f", 5,
                                layers=feature_layers("eagle3", tiny_target.model))
    trained = {}
    for loss in ("soft", "hard"):
        settings = TrainSettings(architecture="eagle3", epochs=6, batch_size=4, learning_rate=3e-3, depth=2,
                                 vocab=30, seed=0, loss=loss, checkpoint_every=100)
        trained[loss] = train(tiny_target, sequences, features, settings, tmp_path / f"{loss}.ckpt", False, {})
    head, held, _ = trained["soft"]
    torch.manual_seed(0)  # the untrained head train() starts from
    untrained = new_eagle3_head(tiny_target, head.vocab_ids, {}).eval()
    rows = tiny_target.model.get_output_embeddings().weight.detach()[head.vocab_ids].float()
    _, held_set = split(sequences)
    before = held_out_divergence(untrained, held_set, features, 512, rows)
    assert held.divergence == pytest.approx(held_out_divergence(head, held_set, features, 512, rows))
    assert 0.0 < held.divergence < 0.8 * before
    assert held.divergence < trained["hard"][1].divergence


def test_resume_refuses_another_loss(tiny_target, tiny_data, tmp_path):
    """--loss is among the options a checkpoint records: resuming under the other one is one line."""
    from mars_cli.errors import UserError
    from mars_cli.training import HeadRecipe

    sequences, features = tiny_data
    soft = TrainSettings(architecture="eagle1", epochs=1, batch_size=4, vocab=30, depth=1, checkpoint_every=2)
    hard = TrainSettings(**{**soft.__dict__, "loss": "hard"})

    def stop_at_3(step: int, total: int, loss: float) -> None:  # after the step-2 checkpoint
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tiny_target, sequences, features, soft, tmp_path / "c.ckpt", False, {}, stop_at_3,
              HeadRecipe(settings=soft).resume_options("p"))
    with pytest.raises(UserError, match=r"--resume: --loss differs from the interrupted run \('soft' there, 'hard' now\)"):
        train(tiny_target, sequences, features, hard, tmp_path / "c.ckpt", True, {}, None,
              HeadRecipe(settings=hard).resume_options("p"))


def test_fine_tuning_starts_from_the_given_head(tiny_target, tiny_data, tmp_path):
    """train(initial=head): the head's weights and draft vocabulary are the starting point (a
    near-zero learning rate returns them), and training from there lowers the loss further."""
    from mars_cli.head.train import feature_layers

    sequences, _ = tiny_data
    features = extract_features(tiny_target, sequences, tmp_path / "f", 5,
                                layers=feature_layers("eagle3", tiny_target.model))
    settings = TrainSettings(architecture="eagle3", epochs=3, batch_size=4, learning_rate=3e-3, depth=2, vocab=30,
                             seed=0, checkpoint_every=100)
    first, _, losses = train(tiny_target, sequences, features, settings, tmp_path / "a.ckpt", False, {})
    still = TrainSettings(**{**settings.__dict__, "epochs": 1, "learning_rate": 1e-12, "vocab": 12})
    same, _, _ = train(tiny_target, sequences, features, still, tmp_path / "b.ckpt", False, {}, initial=first)
    assert torch.equal(same.vocab_ids, first.vocab_ids)  # its vocabulary, not --vocab's 12
    for (name, a), b in zip(first.state_dict().items(), same.state_dict().values()):
        torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=1e-6, msg=name)
    _, _, more = train(tiny_target, sequences, features, settings, tmp_path / "c.ckpt", False, {}, initial=first)
    assert sum(more[:5]) / 5 < sum(losses[:5]) / 5  # it starts where the first run ended, not afresh
    with pytest.raises(UserError, match="fine-tuning starts from an EAGLE-3 head"):
        train(tiny_target, sequences, features, TrainSettings(architecture="eagle1", vocab=30), tmp_path / "d.ckpt",
              False, {}, initial=first)


def test_compiled_loss_equals_the_eager_loss_and_gradients(tiny_target, tiny_data, tmp_path):
    """--compile on: the training step's loss through torch.compile (dynamic shapes) gives the eager
    loss and gradients on batches of two lengths; auto stays eager for a short run, off always."""
    from mars_cli.decoding.target import compile_unavailable
    from mars_cli.head.train import COMPILE_MIN_STEPS, feature_layers, loss_function, new_eagle3_head

    cpu = torch.device("cpu")
    assert loss_function("off", 10_000, cpu) is head_loss
    assert loss_function("auto", COMPILE_MIN_STEPS - 1, cpu) is head_loss
    if compile_unavailable(cpu):  # no C++ compiler: `on` is refused in one line instead
        with pytest.raises(UserError, match="--compile on"):
            loss_function("on", 1, cpu)
        return
    compiled = loss_function("on", 1, cpu)
    assert compiled is not head_loss
    sequences, _ = tiny_data
    features = extract_features(tiny_target, sequences[:6], tmp_path / "f", 4,
                                layers=feature_layers("eagle3", tiny_target.model))
    torch.manual_seed(0)
    head = new_eagle3_head(tiny_target, torch.arange(40), {}).train()
    rows = tiny_target.model.get_output_embeddings().weight.detach()[head.vocab_ids].float()
    for batch in (sequences[:3], sequences[3:6]):
        inputs = make_batch(batch, features, 512)[:3]
        results = []
        for function in (head_loss, compiled):
            head.zero_grad(set_to_none=True)
            loss, _ = function(head, *inputs, 3, rows, "soft")
            loss.backward()
            results.append((loss.detach(), [p.grad.clone() for p in head.parameters()]))
        (eager, eager_grads), (fused, fused_grads) = results
        torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-5)
        for a, b in zip(fused_grads, eager_grads):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def test_training_leaves_the_target_embeddings_without_gradient(tiny_target, tiny_data, tmp_path):
    """The head borrows the target's embeddings untrained: a training step must not build (or sum
    into the target) a vocabulary-wide gradient for them."""
    from mars_cli.head.train import feature_layers, new_eagle3_head

    sequences, _ = tiny_data
    features = extract_features(tiny_target, sequences[:4], tmp_path / "f", 4,
                                layers=feature_layers("eagle3", tiny_target.model))
    head = new_eagle3_head(tiny_target, torch.arange(40), {}).train()
    rows = tiny_target.model.get_output_embeddings().weight.detach()[head.vocab_ids].float()
    embeddings = tiny_target.model.get_input_embeddings().weight
    embeddings.grad = None
    loss, _ = head_loss(head, *make_batch(sequences[:4], features, 512)[:3], 3, rows, "soft")
    loss.backward()
    assert embeddings.grad is None
    assert head.fc.weight.grad is not None and bool(head.fc.weight.grad.abs().sum() > 0)


def test_conversation_prompts_load_and_are_answered_after_their_last_turn(tiny_target, tmp_path):
    """A `messages` prompt (earlier turns, the target's own answers among them) is encoded whole
    through the chat template, and the target answers its last user turn."""
    from mars_cli.prompts import encode_messages, load_prompts

    conversation = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi, how can I help"},
                    {"role": "user", "content": "say it shorter"}]
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "abc"}) + "\n" + json.dumps({"messages": conversation}) + "\n")
    prompts, _, _ = load_prompts(path, path, conversations=True)
    assert prompts == ["abc", conversation]
    with pytest.raises(UserError, match="line 2 is not a JSON object with a 'prompt' field"):
        load_prompts(path, path)  # calibration and the like take single prompts only
    answered = generate(tiny_target, prompts, tmp_path / "gen.jsonl", 10, 2)
    assert answered[1].prompt_ids == encode_messages(tiny_target.tokenizer, conversation)
    assert answered[1].output_ids == hf_greedy(tiny_target, answered[1].prompt_ids, 10)


@pytest.mark.parametrize("messages, problem", [
    ([], "non-empty list"),
    ([{"role": "user", "content": ""}], "non-empty 'content'"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "end with a user turn"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "alternate"),
    ([{"role": "system", "content": "s"}, {"role": "user", "content": "a"}, "x"], "non-empty list of objects"),
])
def test_bad_conversation_prompts_are_one_line_naming_the_line(tmp_path, messages, problem):
    from mars_cli.prompts import load_prompts

    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps({"messages": messages}) + "\n")
    with pytest.raises(UserError, match=f"line 2: .*{problem}"):
        load_prompts(path, path, conversations=True)
