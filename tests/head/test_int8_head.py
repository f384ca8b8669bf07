"""`--int8-head`: int8 rows (mars_cli/head/int8.py) give products close to the head's own, never
run on a stale or swapped weight, leave autograd alone and hand a packed head its packed forwards
back; a float32 head's products run on bfloat16 activations; strict greedy decoding with an int8
head still reproduces the target; `auto` (mars_cli/tuning/int8.py) uses int8 only where the
(mocked) timing says it pays, caches that and measures a corrupt entry again, and keeps a
measurement cut short before int8 was timed as a provisional "own weights" entry; a float16 or
compiled head is refused for `on` in one line; bad values are one line, exit code 2."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F

from mars_cli.decoding.sampling import SamplingParams
from mars_cli.decoding.tree import TreeShape
from mars_cli.decoding.verifiers import Verifier
from mars_cli.errors import UserError
from mars_cli.head import int8 as int8_rows
from mars_cli.head.drafter import HeadDrafter
from mars_cli.head.train import new_eagle3_head
from mars_cli.options import DecodingOptions
from mars_cli.session import Session
from mars_cli.tuning import choice as measured, clock, int8, store
from tests.cli.test_cli import run_cli
from tests.decoding.test_loop import hf_greedy, random_prompt
from tests.trees import decode_all

pytestmark = pytest.mark.skipif(int8_rows.problem(torch.nn.Linear(32, 32).to(torch.bfloat16)) is not None,
                                reason="this torch or CPU has no weight-only int8 product")


@pytest.fixture(autouse=True)
def full_auto_int8_head():
    """Overrides conftest's fixture of this name: here `--int8-head auto` measures."""
    yield


def bf16_head(target, seed: int = 0):
    torch.manual_seed(seed)
    head = new_eagle3_head(target, torch.arange(40), {}).eval()
    with torch.no_grad():  # random layers, not the near-zero start, so that every product matters
        for layer in int8_rows.eligible(head.float()):
            layer.weight.normal_(0, 0.3)
    return head.to(torch.bfloat16)


def counted_int8_products(monkeypatch) -> list[int]:
    calls: list[int] = []
    product = torch._weight_int8pack_mm

    def counting(x, rows, scales):
        calls.append(x.shape[0])
        return product(x, rows, scales)

    monkeypatch.setattr(torch, "_weight_int8pack_mm", counting)
    return calls


# ----------------------------------------------------------------------------- products
def test_int8_products_stay_close_and_leave_no_trace(bf16_target):
    head = bf16_head(bf16_target)
    layers = int8_rows.eligible(head)
    assert len(layers) == sum(isinstance(m, torch.nn.Linear) for m in head.modules())  # every one is 32k wide
    inputs = {layer: torch.randn(3, 5, layer.in_features, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
              for layer in layers}
    expected = {layer: F.linear(inputs[layer], layer.weight).float() for layer in layers}
    assert int8_rows.install(head) == len(layers) and int8_rows.installed(head)
    assert int8_rows.install(head) == 0  # idempotent
    with torch.inference_mode():
        for layer in layers:
            got = layer(inputs[layer]).float()
            assert got.shape == expected[layer].shape
            scale = float(expected[layer].abs().max())
            assert torch.allclose(got, expected[layer], rtol=0, atol=int8_rows.TOLERANCE * scale)
            assert not torch.equal(got, expected[layer])  # the int8 product ran, not the bfloat16 one
    int8_rows.remove(head)
    assert not int8_rows.installed(head) and all("forward" not in layer.__dict__ for layer in layers)


def test_quantized_rows_span_int8_and_rebuild_the_weight():
    weight = torch.randn(16, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    weight[3] = 0  # an all-zero row: a tiny scale, zeros, no NaN
    rows, scales = int8_rows.quantize(weight)
    assert rows.dtype == torch.int8 and scales.dtype == torch.bfloat16 and scales.shape == (16,)
    assert int(rows.abs().amax(dim=1)[0]) == 127 and not bool(rows[3].any())
    rebuilt = rows.float() * scales.float()[:, None]
    assert torch.allclose(rebuilt, weight.float(), rtol=0, atol=float(weight.float().abs().max()) / 127)


def test_a_head_gets_its_previous_forwards_back(bf16_target):
    """Int8 rows replace whatever forward a layer had (packed, in a session that packs) and `remove`
    hands that one back; a product the int8 rows cannot serve runs it too."""
    head = bf16_head(bf16_target)
    seen: list[torch.nn.Linear] = []

    def own(layer: torch.nn.Linear):
        return lambda x: seen.append(layer) or F.linear(x, layer.weight)

    previous = {layer: own(layer) for layer in int8_rows.eligible(head)}
    for layer, forward in previous.items():
        layer.forward = forward
    int8_rows.install(head)
    assert all(layer.__dict__["forward"] is not forward for layer, forward in previous.items())
    x = torch.randn(2, head.fc.in_features).to(torch.bfloat16)
    head.fc(x.requires_grad_())  # autograd: the previous forward
    assert seen == [head.fc]
    int8_rows.remove(head)
    assert all(layer.__dict__["forward"] is forward for layer, forward in previous.items())


def test_a_written_weight_is_never_read_stale(bf16_target):
    head = bf16_head(bf16_target)
    int8_rows.install(head)
    layer = head.fc
    x = torch.randn(2, layer.in_features).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.mul_(2)  # the dtype chooser writes weights in place
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    layer.weight = torch.nn.Parameter(layer.weight.detach().clone())  # swapped for another tensor
    assert torch.equal(layer(x), F.linear(x, layer.weight))


def test_autograd_takes_the_full_product(bf16_target):
    head = bf16_head(bf16_target)
    int8_rows.install(head)
    x = torch.randn(2, head.fc.in_features, dtype=torch.bfloat16, requires_grad=True)
    out = head.fc(x)
    assert torch.equal(out, F.linear(x, head.fc.weight))
    out.float().sum().backward()
    assert x.grad is not None


# ----------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("head_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seed", range(3))
def test_strict_greedy_with_an_int8_head_reproduces_the_target(tiny_target, seed, head_dtype, monkeypatch):
    """The oracle: a float32 target, strict greedy verification, a bfloat16 or float32 head drafting
    on int8 rows (its drafts are its own; the output must be the target's, token for token)."""
    calls = counted_int8_products(monkeypatch)
    rng = random.Random(seed)
    prompt = random_prompt(rng, len(tiny_target.tokenizer), 15)
    expected = hf_greedy(tiny_target, prompt, 30)
    head = bf16_head(tiny_target, seed).to(head_dtype).attach(tiny_target.model)
    assert int8_rows.install(head) == len(int8_rows.eligible(head)) > 0
    for shape in (TreeShape(1, 4), TreeShape(4, 12)):
        drafter = HeadDrafter(head, tiny_target, SamplingParams(0.0), shape=shape)
        assert decode_all(tiny_target, drafter, prompt, 30, Verifier("strict"), 4, shape.tokens) == expected
    assert calls  # the drafts came from int8 products


# ----------------------------------------------------------------------------- choosing
def fake_blocks(monkeypatch, full_ms: float, int8_ms: float | None) -> list[str]:
    """clock.time_interleaved mocked: fixed block times per variant, each variant's real block (its
    eviction first) still run once. `int8_ms` None: cut short before int8's first block."""
    runs: list[str] = []

    def timed(run, items, repeats, synchronize=lambda: None, deadline=None, prepare=lambda item: None):
        blocks = {"full": [full_ms] * repeats, "int8": [int8_ms] * repeats}
        reached = [variant for variant in items if blocks[variant][0] is not None]
        for variant in reached:
            prepare(variant)
            run(variant)
            runs.append(variant)
        return {variant: blocks[variant] for variant in reached}

    monkeypatch.setattr(clock, "time_interleaved", timed)
    return runs


def test_auto_uses_int8_where_the_measurement_says_it_pays_and_caches_it(bf16_target, monkeypatch, cache, capsys):
    head = bf16_head(bf16_target)
    runs = fake_blocks(monkeypatch, full_ms=10.0, int8_ms=8.0)
    choice = int8.settle(head, bf16_target, "auto")
    assert choice.used and not choice.provenance.cached and int8_rows.installed(head) and runs == ["full", "int8"]
    assert choice.provenance.provisional is None  # a quiet machine, measured in full: settled
    assert "int8 weights" in capsys.readouterr().err
    entry = json.loads(next((cache / int8.FOLDER).glob("*.json")).read_text())
    assert entry["schema"] == int8.SCHEMA and entry["used"] is True and entry["provisional"] is None
    assert entry["key"]["linears"][0] == list(head.fc.weight.shape)
    int8_rows.remove(head)
    again = int8.settle(head, bf16_target, "auto")
    assert again.provenance.cached and again.used and int8_rows.installed(head)
    assert runs == ["full", "int8"]  # read, not measured


def test_auto_keeps_the_heads_weights_within_noise_after_timing_twice(bf16_target, monkeypatch, cache):
    head = bf16_head(bf16_target)
    runs = fake_blocks(monkeypatch, full_ms=10.0, int8_ms=9.9)  # 0.99: a close call at 0.97
    choice = int8.settle(head, bf16_target, "auto")
    assert not choice.used and choice.timed_twice and not int8_rows.installed(head)
    assert runs == ["full", "int8"] * 2


@pytest.mark.parametrize("entry", ["{not json", '{"schema": 1}', "contradicts"])
def test_a_corrupt_or_contradictory_entry_is_measured_again(bf16_target, monkeypatch, cache, entry):
    head = bf16_head(bf16_target)
    runs = fake_blocks(monkeypatch, full_ms=10.0, int8_ms=8.0)
    key = int8.int8_key(head, bf16_target)
    path = store.cache_path(key, int8.FOLDER)
    path.parent.mkdir(parents=True, exist_ok=True)
    if entry == "contradicts":  # says int8, with times that say it does not pay
        entry = json.dumps({"schema": int8.SCHEMA, "used": True, "ms_full": 10.0, "ms_int8": 12.0, "key": key})
    path.write_text(entry)
    choice = int8.settle(head, bf16_target, "auto")
    assert not choice.provenance.cached and choice.used and runs == ["full", "int8"]


def test_a_measurement_cut_before_int8_is_a_provisional_own_weights_entry(bf16_target, monkeypatch, cache, capsys):
    """The budget ran out before int8's first block (the KeyError of issue 56): the head drafts on
    its own weights, and the entry is saved provisional; on a quiet machine it is measured again
    at once, up to QUIET_ATTEMPTS times in a row, then used as it is until RETRY_AFTER_S passed."""
    head = bf16_head(bf16_target)
    runs = fake_blocks(monkeypatch, full_ms=10.0, int8_ms=None)
    choice = int8.settle(head, bf16_target, "auto")
    assert not choice.used and not int8_rows.installed(head) and choice.ms_int8 is None
    assert "budget" in choice.provenance.provisional and not choice.provenance.cached
    assert "provisional" in capsys.readouterr().err
    entry = json.loads(next((cache / int8.FOLDER).glob("*.json")).read_text())
    assert entry["used"] is False and entry["ms_int8"] is None and "budget" in entry["provisional"]
    assert entry["busy"] is False and entry["attempts"] == 1
    read = measured.read(int8.Int8Measurement(head, bf16_target))
    assert read is not None and not read.used and read.provenance.cached and read.provenance.provisional
    for attempt in range(2, measured.QUIET_ATTEMPTS + 1):  # a quiet machine: goes on where it stopped
        again = int8.settle(head, bf16_target, "auto")
        assert not again.used and not again.provenance.cached and again.provenance.attempts == attempt
    assert runs == ["full"] * measured.QUIET_ATTEMPTS
    last = int8.settle(head, bf16_target, "auto")  # cut short every time: used as it is, not measured
    assert last.provenance.cached and not last.used and runs == ["full"] * measured.QUIET_ATTEMPTS


def test_the_real_measurement_times_both_and_leaves_the_head_as_it_was(bf16_target, monkeypatch, cache):
    head = bf16_head(bf16_target).attach(bf16_target.model)
    monkeypatch.setattr(int8, "REPEATS", 2)
    choice = int8.measure(head, bf16_target, int8.int8_key(head, bf16_target))
    assert choice.ms_full > 0 and choice.ms_int8 > 0 and choice.used == (choice.ms_int8 <= 0.97 * choice.ms_full)
    assert choice.provenance.provisional is None  # no deadline: every block timed
    assert not int8_rows.installed(head) and all("forward" not in layer.__dict__ for layer in int8_rows.eligible(head))


def test_a_float16_or_compiled_head_drafts_on_its_own_weights(tiny_target, bf16_target):
    half_head = new_eagle3_head(tiny_target, torch.arange(40), {}).eval().half()
    choice = int8.settle(half_head, tiny_target, "auto")
    assert not choice.used and "bfloat16 or float32 head" in choice.problem and not int8_rows.installed(half_head)
    with pytest.raises(UserError, match="--int8-head on: only a bfloat16 or float32 head"):
        int8.settle(half_head, tiny_target, "on")
    head = bf16_head(bf16_target)
    assert "compiled" in int8.settle(head, bf16_target, "auto", compiled=True).problem
    assert int8.settle(head, bf16_target, "on").used and int8_rows.installed(head)
    assert not int8.settle(head, bf16_target, "off").used and not int8_rows.installed(head)


def test_a_float32_head_multiplies_in_bfloat16_and_answers_in_float32(tiny_target, monkeypatch):
    """A float32 head's int8 products take bfloat16 activations (the kernel's float32 path is slow)
    and hand float32 back: the rest of the head runs as before."""
    calls: list[torch.dtype] = []
    product = torch._weight_int8pack_mm
    monkeypatch.setattr(torch, "_weight_int8pack_mm",
                        lambda x, rows, scales: calls.append(x.dtype) or product(x, rows, scales))
    head = bf16_head(tiny_target).float()
    x = torch.randn(3, head.fc.in_features)
    with torch.inference_mode():
        expected = F.linear(x, head.fc.weight)
        assert int8.settle(head, tiny_target, "on").used
        calls.clear()  # the probe's product
        got = head.fc(x)
    assert got.dtype == torch.float32 and calls == [torch.bfloat16]
    assert torch.allclose(got, expected, rtol=0, atol=int8_rows.TOLERANCE * float(expected.abs().max()))


def test_a_head_with_non_finite_weights_keeps_them(bf16_target):
    """Rounded to int8 a NaN or infinite weight would turn finite, hiding a broken head from the
    drafter's own NaN check (it stops drafting with one note): such a head is left as it is."""
    head = bf16_head(bf16_target)
    with torch.no_grad():
        head.lm_head.weight[3, 5] = float("nan")
    assert int8_rows.problem(head) == "the draft head's weights are not all finite"
    assert not int8.settle(head, bf16_target, "auto").used and not int8_rows.installed(head)


# ----------------------------------------------------------------------------- the flag
def test_a_bad_value_is_one_line_exit_2(capsys, tiny_dir):
    code, out, err = run_cli(capsys, "generate", "abc", "--target", str(tiny_dir), "--device", "cpu",
                             "--int8-head", "maybe")
    assert code == 2 and out == ""
    assert err.strip() == "mars: error: --int8-head maybe: expected auto, on or off"


def test_a_session_drafts_on_int8_rows_and_says_so(tiny_dir, bf16_target, tmp_path, monkeypatch, capsys):
    directory = tmp_path / "head"
    bf16_head(bf16_target).float().save_pretrained(directory)
    calls = counted_int8_products(monkeypatch)
    options = dict(target=str(tiny_dir), device="cpu", dtype="bfloat16", draft=f"head:{directory}", num_draft=3,
                   max_new_tokens=12, packed_weights="off")
    session = Session(DecodingOptions.of(**options, int8_head="on"), target=bf16_target)
    assert session.config()["int8_head"] is True and int8_rows.installed(session.drafter.head)
    assert session.run("abc abc").stats.new_tokens > 0 and calls
    plain = Session(DecodingOptions.of(**options, int8_head="off"), target=bf16_target)
    assert plain.config()["int8_head"] is False and not int8_rows.installed(plain.drafter.head)
    ngram = Session(DecodingOptions.of(**{**options, "draft": "ngram"}, int8_head="on"), target=bf16_target)
    assert ngram.config()["int8_head"] is False
    assert "--int8-head on is ignored" in capsys.readouterr().err
