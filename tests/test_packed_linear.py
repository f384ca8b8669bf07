"""Packed bfloat16 linears (mars_cli/packed_linear.py): the same outputs as `nn.Linear`, bit for bit,
the same parameters (tied weights, fingerprints), a fresh packing when the weight changes, and the
same tokens from a whole decoding session, packed or not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mars_cli import packed_linear
from mars_cli.models import load_model
from mars_cli.options import DecodingOptions
from mars_cli.packed_linear import MAX_ROWS, PackedLinear, pack_linears
from mars_cli.session import Session

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="this torch has no oneDNN packed linear ops")


def unpack(model: nn.Module) -> int:
    """The reference: every PackedLinear back to a plain nn.Linear with the same parameters."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                plain = nn.Linear.__new__(nn.Linear)
                plain.__dict__.update({k: v for k, v in child.__dict__.items() if k != "_packed"})
                setattr(parent, name, plain)
                swapped += 1
    return swapped


def packed_copy(linear: nn.Linear) -> PackedLinear:
    holder = nn.Sequential(linear)
    assert pack_linears(holder) == 1
    return holder[0]


@pytest.mark.parametrize("shape", [(64, 96, False), (96, 40, True), (576, 1536, False)])
def test_packed_forward_equals_linear_bit_for_bit(shape):
    torch.manual_seed(0)
    in_features, out_features, bias = shape
    linear = nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)
    packed = packed_copy(nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16))
    packed.load_state_dict(linear.state_dict())
    with torch.inference_mode():
        for rows in (1, 2, 5, 17, MAX_ROWS, MAX_ROWS + 1, 200):
            x = torch.randn(1, rows, in_features).to(torch.bfloat16)
            assert torch.equal(packed(x), linear(x)), rows
    assert packed._packed is not None  # the packed kernel did run


def test_falls_back_to_linear_with_autograd_float32_or_wide_inputs():
    torch.manual_seed(0)
    packed = packed_copy(nn.Linear(64, 64, bias=False))
    x = torch.randn(3, 64)
    with torch.inference_mode():
        assert torch.equal(packed(x), nn.functional.linear(x, packed.weight))  # float32: untouched
    assert packed._packed is None
    packed.to(torch.bfloat16)
    wide = torch.randn(MAX_ROWS + 1, 64).to(torch.bfloat16)
    with torch.inference_mode():
        packed(wide)
    assert packed._packed is None  # a prefill-wide input takes F.linear
    y = packed(torch.randn(2, 64).to(torch.bfloat16).requires_grad_())
    assert y.requires_grad and packed._packed is None  # training: autograd, F.linear


def test_repacks_when_the_weight_changes():
    torch.manual_seed(0)
    packed = packed_copy(nn.Linear(64, 32, bias=False).to(torch.bfloat16))
    x = torch.randn(1, 64).to(torch.bfloat16)
    with torch.inference_mode():
        packed(x)
        first = packed._packed[2]
        packed.weight.mul_(2)  # in place: the version counter moves
        assert torch.equal(packed(x), nn.functional.linear(x, packed.weight))
        assert packed._packed[2] is not first
        packed.weight.data = torch.randn(32, 64).to(torch.bfloat16)  # another tensor (a dtype swap)
        assert torch.equal(packed(x), nn.functional.linear(x, packed.weight))


def test_bfloat16_load_packs_and_keeps_parameters_tied(tiny_dir):
    reference = load_model(str(tiny_dir), device="cpu", dtype="float32")
    loaded = load_model(str(tiny_dir), device="cpu", dtype="bfloat16")
    linears = [m for m in loaded.model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, PackedLinear) for m in linears)
    assert not any(isinstance(m, PackedLinear) for m in reference.model.modules())  # float32 is left alone
    tied = loaded.model.config.tie_word_embeddings
    assert (loaded.model.lm_head.weight is loaded.model.get_input_embeddings().weight) == bool(tied)
    assert loaded.fingerprint == reference.fingerprint  # heads and profiles are still found


def test_unavailable_ops_pack_nothing(monkeypatch):
    monkeypatch.setattr(packed_linear, "available", lambda: False)
    assert pack_linears(nn.Sequential(nn.Linear(4, 4))) == 0


@pytest.mark.parametrize("draft, topk", [("none", 1), ("ngram", 1), ("model", 1), ("model", 3)])
def test_bfloat16_decoding_is_the_same_packed_or_not(tiny_dir, tiny_draft_dir, draft, topk):
    """Plain, n-gram chains, draft-model chains and trees: token for token the same sequence."""
    spec = str(tiny_draft_dir) if draft == "model" else draft
    prompts = [[3, 17, 22, 9, 41], [5, 5, 5, 5, 8, 1, 30]]
    outputs = {}
    for mode in ("packed", "plain"):
        target = load_model(str(tiny_dir), device="cpu", dtype="bfloat16")
        draft_model = load_model(str(tiny_draft_dir), device="cpu", dtype="bfloat16") if draft == "model" else None
        if mode == "plain":
            assert unpack(target.model) > 0
            if draft_model is not None:
                unpack(draft_model.model)
        options = DecodingOptions.of(draft=spec, num_draft=3, draft_topk=topk, draft_tokens=6 if topk > 1 else "auto",
                                     max_new_tokens=24, dtype="bfloat16")
        session = Session(options, target=target, draft_model=draft_model)
        outputs[mode] = [session.run(ids).token_ids for ids in prompts]
    assert outputs["packed"] == outputs["plain"]


@pytest.mark.embedded
def test_embedded_default_in_bfloat16_is_the_same_packed_or_not():
    """The default drafter (the shipped head, trees) on SmolLM2-135M: target and head packed give
    the tokens that unpacked ones give."""
    from mars_cli.head.drafter import HeadDrafter

    prompt = "Write a Python function that checks whether a number is prime."
    outputs = {}
    for mode in ("packed", "plain"):
        target = load_model("smollm2-135m", device="cpu", dtype="bfloat16")
        options = DecodingOptions.of(draft="head", max_new_tokens=40, dtype="bfloat16", draft_topk=4, draft_tokens=16, num_draft=4)
        session = Session(options, target=target)
        assert isinstance(session.drafter, HeadDrafter)
        if mode == "plain":
            assert unpack(target.model) == 211 and unpack(session.drafter.head) > 0
        result = session.run(prompt)
        outputs[mode] = result.token_ids
        assert result.stats.new_tokens > result.stats.rounds  # the head drafted, and was accepted
    assert outputs["packed"] == outputs["plain"]
