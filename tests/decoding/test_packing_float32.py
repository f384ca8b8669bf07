"""Packed float32 linears (mars_cli/decoding/packing.py): the exact mode on prepacked weights gives dense
float32's numbers at every width, strict drafting on them reproduces plain decoding on them token
for token, and the dtype chooser's switch packs each dtype once. Runs where torch packs float32
(any x86 CPU with oneDNN), unlike tests/decoding/test_packing.py's bfloat16 half."""

from __future__ import annotations

import pytest
import torch

from mars_cli.decoding import packing
from mars_cli.models import load_model
from mars_cli.options import DecodingOptions
from mars_cli.session import Session
from tests.head.test_eagle3 import write_public_head

pytestmark = pytest.mark.skipif(packing.problem(torch.nn.Linear(8, 8)) is not None,
                                reason="this torch or CPU has no oneDNN packed float32 product")


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_packed_float32_logits_are_dense_ones_at_every_width(tiny_target):
    ids = torch.randint(0, tiny_target.vocab_size, (1, 40), generator=torch.Generator().manual_seed(2))
    widths = (1, 2, 9, 17, 40)
    dense = [logits(tiny_target.model, ids[:, :width]) for width in widths]
    try:
        assert packing.install(tiny_target.model) > 0 and packing.installed(tiny_target.model)
        packed = [logits(tiny_target.model, ids[:, :width]) for width in widths]
    finally:
        packing.remove(tiny_target.model)
    for expected, got in zip(dense, packed):
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
        assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("draft, tree", [("ngram", {}), ("head", {"draft_topk": 1}),
                                         ("head", {"draft_topk": 2, "draft_tokens": 6})])
def test_strict_drafting_on_packed_float32_is_plain_decoding_token_for_token(tiny_dir, tiny_target, tmp_path,
                                                                             draft, tree):
    def run(**drafting):
        session = Session(DecodingOptions.of(target=str(tiny_dir), device="cpu", dtype="float32",
                                             packed_weights="on", max_new_tokens=40, **drafting))
        assert session.packing.packed and packing.installed(session.target.model)
        return session.run("abc abd abc abd")

    if draft == "head":
        draft = f"head:{write_public_head(tmp_path / 'head', tiny_target, seed=3)}"
    drafting = run(draft=draft, num_draft=4, verify="strict", **tree)
    assert drafting.stats.drafted > 0  # rounds verified wide, on the packed kernels
    assert drafting.token_ids == run(draft="none").token_ids


def test_the_switch_packs_each_dtype_once(tiny_dir):
    target = load_model(str(tiny_dir), device="cpu", dtype="float32")
    switch = packing.Switch(target.model)
    assert switch.set(True) and packing.installed(target.model)
    float32_forwards = switch.forwards[torch.float32]
    assert not switch.set(False) and not packing.installed(target.model)
    assert switch.set(True) and switch.forwards[torch.float32] is float32_forwards  # not packed again
    switch.set(False)
    for parameter in target.model.parameters():
        parameter.data = parameter.data.to(torch.float16)  # a dtype that is never packed
    assert not switch.set(True) and not packing.installed(target.model)
    assert set(switch.forwards) == {torch.float32}
