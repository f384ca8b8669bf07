"""Degenerate sampling settings and broken drafters (issue 24, item 3): a temperature too small
to divide by decodes greedily, a top-p that keeps nothing keeps the top token, a drafter whose
probabilities are NaN or infinite stops drafting (one note) instead of crashing the target's
decoding, and `train-head` neither trains at an absurd --lr nor saves non-finite weights."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mars_cli import notes
from mars_cli.cli import main
from mars_cli.decoding.drafters import ModelDrafter
from mars_cli.decoding.sampling import (GREEDY_BELOW, PositionNoise, SamplingParams, coupled_sample, probabilities,
                                        process_logits)
from mars_cli.decoding.tree import DraftTree, TreeShape
from mars_cli.decoding.verifiers import Verifier
from mars_cli.errors import UserError
from mars_cli.head.drafter import load_head
from mars_cli.head.train import TrainSettings, train

from ..head.test_eagle3 import write_public_head
from ..head.test_head import random_head, tiny_data  # noqa: F401 (a fixture)

NAN_NOTE = "proposed NaN or infinite probabilities"


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch, tmp_path_factory):
    """Every test sees its own once-per-process notes, and measures cost curves in its own cache
    (never the developer's)."""
    monkeypatch.setattr(notes, "_SHOWN", set())
    monkeypatch.setenv("MARS_CACHE", str(tmp_path_factory.getbasetemp() / "degenerate-cache"))


def generate(capsys, tiny_dir: Path, *args: str) -> tuple[int, str, str]:
    code = main(["generate", "The cat sat on the mat. The cat", "--target", str(tiny_dir), "--device", "cpu",
                 "-n", "12", "--seed", "3", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --------------------------------------------------------------------------- process_logits
@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-40, 1e-5, GREEDY_BELOW / 2])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature):
    params = SamplingParams(temperature)
    assert params.greedy
    logits = torch.tensor([[3.0, -2.0, 7.5, 7.0], [1e4, -1e4, 0.0, 5.0]])
    processed = process_logits(logits, params)
    assert torch.equal(processed, logits)  # unscaled, as at T = 0: only the order matters
    assert torch.isfinite(probabilities(processed)).all()


@pytest.mark.parametrize("temperature", [GREEDY_BELOW, 1e-3, 0.8, 1e6])
def test_temperatures_from_the_bound_up_sample_finitely(temperature):
    params = SamplingParams(temperature)
    assert not params.greedy
    logits = torch.tensor([[3.0, -2.0, 7.5, 7.0], [1e4, -1e4, 0.0, 5.0], [-1e4, -1e4, -1e4, -1e4]])
    processed = process_logits(logits, params)
    probs = probabilities(processed)
    assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(3))
    drawn = coupled_sample(processed, PositionNoise(0, 4).rows([0, 1, 2], 4, "cpu"))
    assert all(probs[row, token] > 0 for row, token in enumerate(drawn.tolist()))


@pytest.mark.parametrize("top_p", [1e-300, 5e-324, 1e-45, 1e-9])
@pytest.mark.parametrize("temperature", [0.8, 1.0, 50.0])
def test_a_top_p_that_keeps_nothing_keeps_the_top_token(top_p, temperature):
    logits = torch.tensor([[0.1, 2.0, 1.9, -3.0], [5.0, 5.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    processed = process_logits(logits, SamplingParams(temperature, top_p=top_p))
    kept = torch.isfinite(processed)
    assert kept.sum(-1).tolist() == [1, 1, 1]
    assert kept.float().argmax(-1).tolist() == [1, processed[1].argmax().item(), processed[2].argmax().item()]
    probs = probabilities(processed)
    assert torch.isfinite(probs).all()
    assert coupled_sample(processed, PositionNoise(0, 4).rows([0, 1, 2], 4, "cpu"))[0].item() == 1


def test_top_p_still_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(process_logits(logits, SamplingParams(1.0, top_p=0.7)))
    assert kept.tolist() == [[True, True, False, False]]


def test_finite_logits_overflowing_at_a_small_temperature_are_not_called_nan():
    """T >= the bound still overflows logits of 1e36: the error says so, not that the target
    produced NaN."""
    logits = torch.tensor([[1e36, -1e36, 0.0], [0.0, 1.0, 2.0]])
    verifier = Verifier("strict", sampling=SamplingParams(GREEDY_BELOW))
    with pytest.raises(FloatingPointError, match="overflow float32") as caught:
        verifier.verify(logits, DraftTree.chain(torch.tensor([1])), PositionNoise(0, 3))
    assert "NaN" not in str(caught.value)
    with pytest.raises(FloatingPointError, match="the target produced NaN"):
        verifier.verify(torch.tensor([[float("nan"), 0.0, 1.0]]), DraftTree.empty("cpu"))


# --------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize("draft", [[], ["--draft", "none"]], ids=["default-drafter", "no-drafter"])
@pytest.mark.parametrize("temperature", ["1e-300", "1e-5"])
def test_generate_at_a_vanishing_temperature_decodes_greedily(capsys, tiny_dir, draft, temperature):
    code, out, err = generate(capsys, tiny_dir, "--temperature", temperature, *draft)
    assert code == 0, err
    assert out.strip() and "Traceback" not in err and "NaN" not in err
    assert err.count("decoding greedily") == 1
    greedy_code, greedy_out, _ = generate(capsys, tiny_dir, "--temperature", "0", *draft)
    assert greedy_code == 0 and out == greedy_out


def test_generate_with_a_top_p_that_keeps_nothing_samples_the_top_token(capsys, tiny_dir):
    code, out, err = generate(capsys, tiny_dir, "--top-p", "1e-300", "--temperature", "0.8")
    assert code == 0, err
    assert out.strip() and "Traceback" not in err
    greedy_code, greedy_out, _ = generate(capsys, tiny_dir, "--temperature", "0")
    assert greedy_code == 0 and out == greedy_out  # only the top token is ever kept


def broken_head(directory: Path, target, tensor: str, value: float) -> Path:
    """A valid EAGLE-3 head directory whose `tensor` holds `value` (NaN or inf) in every entry."""
    write_public_head(directory, target)
    tensors = load_file(str(directory / "model.safetensors"))
    tensors[tensor] = torch.full_like(tensors[tensor], value)
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


@pytest.mark.parametrize("verify", ["strict", "mars"])
@pytest.mark.parametrize("topk", ["1", "2"], ids=["chain", "tree"])
@pytest.mark.parametrize("tensor, value", [("lm_head.weight", math.nan), ("fc.weight", math.inf)])
def test_a_nan_head_stops_drafting_with_one_note(capsys, tiny_dir, tiny_target, tmp_path, verify, topk, tensor, value):
    head = broken_head(tmp_path / "head", tiny_target, tensor, value)
    args = ("--temperature", "0.8", "--verify", verify, "-k", "3", "--draft-topk", topk, "--draft-tokens", "4")
    code, out, err = generate(capsys, tiny_dir, "--draft", f"head:{head}", *args)
    assert code == 0, err
    assert out.strip() and "Traceback" not in err
    lines = [line for line in err.splitlines() if NAN_NOTE in line]
    assert len(lines) == 1 and str(head) in lines[0] and lines[0].startswith("mars: note: ")
    # from the first round on the target decodes alone: what --draft none samples with the seed
    plain_code, plain_out, _ = generate(capsys, tiny_dir, "--draft", "none", *args)
    assert plain_code == 0 and out == plain_out


def test_a_nan_head_in_greedy_decoding_stops_drafting_too(capsys, tiny_dir, tiny_target, tmp_path):
    head = broken_head(tmp_path / "head", tiny_target, "lm_head.weight", math.nan)
    code, out, err = generate(capsys, tiny_dir, "--draft", f"head:{head}", "-k", "3", "--draft-topk", "1")
    assert code == 0 and err.count(NAN_NOTE) == 1
    assert out == generate(capsys, tiny_dir, "--draft", "none", "-k", "3")[1]


def test_the_head_drafts_again_after_reset_and_notes_once(tiny_target, tmp_path, capsys):
    from mars_cli.head.drafter import HeadDrafter

    head = load_head(f"head:{broken_head(tmp_path / 'head', tiny_target, 'lm_head.weight', math.nan)}", tiny_target)
    drafter = HeadDrafter(head, tiny_target, SamplingParams(0.8))
    prompt = torch.tensor([5, 9, 12, 7, 5, 9])
    features = torch.zeros(prompt.numel() - 1, head.feature_width)
    for _ in range(2):
        drafter.reset()
        assert not drafter.failed
        drafter.observe_features(features)
        assert drafter.propose(prompt, 3).size == 0 and drafter.failed
        assert drafter.propose(prompt, 3).size == 0  # the rest of the sequence: nothing
    assert capsys.readouterr().err.count(NAN_NOTE) == 1


@pytest.mark.parametrize("shape", [TreeShape(), TreeShape(2, 4)], ids=["chain", "tree"])
def test_a_nan_draft_model_stops_drafting(tiny_draft, shape, capsys):
    broken = dataclasses.replace(tiny_draft, model=copy.deepcopy(tiny_draft.model))  # the fixture stays sound
    with torch.no_grad():
        broken.model.lm_head.weight.fill_(math.nan)
    drafter = ModelDrafter(broken, SamplingParams(0.8), shape)
    drafter.reset()
    tree = drafter.propose(torch.tensor([5, 9, 12, 7, 5, 9]), 3)
    assert tree.size == 0 and drafter.failed
    err = capsys.readouterr().err
    assert err.count(NAN_NOTE) == 1 and f"draft model {tiny_draft.spec}" in err


# --------------------------------------------------------------------------- train-head
@pytest.mark.parametrize("lr", ["inf", "nan", "0", "1e6", "-1e-3", "-inf"])
def test_train_head_refuses_an_absurd_learning_rate_before_loading(capsys, tmp_path, lr):
    missing = tmp_path / "no-such-model"  # loading it would fail: the refusal must come first
    code = main(["train-head", "--target", str(missing), "--lr", lr, "--out", str(tmp_path / "head")])
    err = capsys.readouterr().err
    assert code == 2 and "--lr must be in (0, 1]" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "head").exists()


@pytest.mark.parametrize("value", [math.nan, math.inf, 1e6])  # 1e6 overflows the fp16 file
def test_a_head_with_non_finite_weights_is_not_saved_over_a_good_one(tiny_target, tmp_path, value):
    directory = write_public_head(tmp_path / "head", tiny_target)
    before = {name: (directory / name).read_bytes() for name in ("config.json", "model.safetensors")}
    head = load_head(f"head:{directory}", tiny_target)
    head.config.mars = {"target": tiny_target.spec, "target_fingerprint": tiny_target.fingerprint}
    with torch.no_grad():
        head.fc.weight[0, 0] = value
    with pytest.raises(UserError, match="not saved") as caught:
        head.save_pretrained(directory)
    message = str(caught.value)
    assert str(directory) in message and "fc.weight" in message and "\n" not in message
    assert {name: (directory / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "model.safetensors"]


def test_a_single_file_head_with_nan_weights_is_not_saved(tiny_target, tmp_path):
    head = random_head(tiny_target)
    path = tmp_path / "head.safetensors"
    head.save(path)
    good = path.read_bytes()
    with torch.no_grad():
        head.fc.weight.fill_(math.nan)  # the head's own weight (the target's embeddings are only borrowed)
    with pytest.raises(UserError, match=re.escape(f"draft head {path} not saved")):
        head.save(path)
    assert path.read_bytes() == good and not path.with_name(path.name + ".tmp").exists()


@pytest.mark.parametrize("architecture", ["eagle1", "eagle3"])
def test_training_that_diverges_stops_before_saving(tiny_target, tiny_data, tmp_path, architecture):  # noqa: F811
    """An --lr the CLI accepts can still diverge: the first non-finite loss ends the run in one
    line (the checkpoint holds the weights before it), not a NaN head after all the epochs."""
    from mars_cli.head.data import extract_features
    from mars_cli.head.train import feature_layers

    sequences, features = tiny_data
    if architecture == "eagle3":
        layers = feature_layers("eagle3", tiny_target.model)
        features = extract_features(tiny_target, sequences, tmp_path / "features", 5, layers=layers)
    settings = TrainSettings(architecture=architecture, epochs=2, batch_size=4, learning_rate=math.inf, depth=1,
                             vocab=30, seed=0, checkpoint_every=100)
    with pytest.raises(UserError, match="training diverged at step") as caught:
        train(tiny_target, sequences, features, settings, tmp_path / "ckpt", False, {})
    assert "\n" not in str(caught.value) and "--lr" in str(caught.value)
