"""`--dtype q4`'s linears (decoding/quantized.py): the codes behind a GGUF's dequantised weights are
found again exactly, and the int4 kernel's product equals `F.linear` on those weights to float32
rounding; weights from no quantized file are quantized afresh, and say so."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from hypothesis import given, settings
from hypothesis import strategies as st

from mars_cli.decoding import quantized



def usable_kernels() -> list[str]:
    from mars_cli.decoding import kernels

    found = ["torch"] if hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") else []
    return found + (["mars"] if kernels.problem() is None else [])


KERNELS = usable_kernels()


def through_gguf(weight: torch.Tensor, kind: GGMLQuantizationType) -> torch.Tensor:
    """`weight` as a GGUF file of `kind` holds it, dequantised as loading one does (gguf-py's own code)."""
    return torch.from_numpy(dequantize(quantize(weight.numpy(), kind), kind).astype(np.float32))


def relative_error(layer: quantized.QuantizedLinear, weight: torch.Tensor, rows: int = 5) -> float:
    x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(1))
    expected = F.linear(x, weight)
    return float((layer(x) - expected).abs().max() / expected.abs().max())


@pytest.mark.parametrize("kind, levels", [(GGMLQuantizationType.Q4_0, 16), (GGMLQuantizationType.Q4_1, 16),
                                          (GGMLQuantizationType.Q5_0, 256), (GGMLQuantizationType.Q5_1, 256),
                                          (GGMLQuantizationType.Q8_0, 256)])
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_gguf_types_codes_are_found_again_exactly(kind, levels, kernel):
    weight = through_gguf(torch.randn(48, 128, generator=torch.Generator().manual_seed(0)), kind)
    found = quantized.recover(weight)
    assert found.exact and found.levels == levels
    rebuilt = (found.offset.repeat_interleave(quantized.GROUP, 1)
               + found.scale.repeat_interleave(quantized.GROUP, 1) * found.codes)
    assert torch.allclose(rebuilt, weight, rtol=0, atol=1e-6 * float(weight.abs().max()))
    layer = quantized.QuantizedLinear.from_weight(weight, None, kernel)
    assert layer.exact and len(layer.matrices) == (1 if levels == 16 or kernel == "mars" else 2)
    assert relative_error(layer, weight) < 1e-5  # float32 rounding, not quantization error


@pytest.mark.parametrize("kernel", KERNELS)
def test_float_weights_are_quantized_afresh_and_say_so(kernel):
    weight = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    layer = quantized.QuantizedLinear.from_weight(weight, None, kernel)
    assert not layer.exact and layer.levels == 16
    error = relative_error(layer, weight)
    assert 1e-4 < error < 0.2  # a real 4-bit quantization: off, but close


@settings(max_examples=25, deadline=None)
@given(codes=st.lists(st.integers(0, 15), min_size=32, max_size=32),
       scale=st.floats(1e-4, 10.0), offset=st.floats(-10.0, 10.0))
def test_any_16_level_group_is_exact(codes, scale, offset):
    """One group of `offset + scale * q` with fp16 numbers (as Q4_1 stores them), rows of it."""
    scale16, offset16 = torch.tensor(scale).half().float(), torch.tensor(offset).half().float()
    row = offset16 + scale16 * torch.tensor(codes, dtype=torch.float32)
    weight = row.repeat(16, 1)
    found = quantized.recover(weight)
    assert found.exact
    layer = quantized.QuantizedLinear.from_weight(weight, None)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(layer(x), F.linear(x, weight), rtol=1e-5, atol=1e-5 * float(weight.abs().max()) * 32)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17])
def test_bias_and_leading_dimensions_are_kept(kernel, rows):
    weight = through_gguf(torch.randn(32, 64, generator=torch.Generator().manual_seed(3)), GGMLQuantizationType.Q4_1)
    bias = torch.randn(32)
    layer = quantized.QuantizedLinear.from_weight(weight, bias, kernel)
    x = torch.randn(2, rows, 64)
    assert layer(x).shape == (2, rows, 32)
    assert torch.allclose(layer(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-4)


def test_install_serves_the_models_linears_and_remove_restores_them(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 48),
                                torch.nn.Linear(48, 20))  # the last: 20 outputs do not tile
    with torch.no_grad():
        for layer in (model[0], model[2]):
            layer.weight.copy_(through_gguf(layer.weight.detach().clone(), GGMLQuantizationType.Q4_1))
    x = torch.randn(4, 64)
    before = model(x)
    copy = tmp_path / "q4.safetensors"
    done = quantized.install(model, copy)
    assert (done.quantized, done.exact, done.read) == (2, 2, False) and set(done.left) == {"3"} and copy.is_file()
    assert quantized.installed(model)
    served = model(x)
    assert torch.allclose(served, before, rtol=1e-5, atol=1e-5)
    assert quantized.install(model).quantized == 2  # again: the same forwards, nothing rebuilt
    quantized.remove(model)
    assert not quantized.installed(model) and torch.equal(model(x), before)
    again = quantized.install(model, copy)  # the stored codes: the same products
    assert again.read and again.exact == 2 and torch.equal(model(x), served)
    quantized.remove(model)
    copy.write_bytes(b"not a safetensors file")
    assert not quantized.install(model, copy).read and torch.equal(model(x), served)  # recovered, rewritten


def test_layers_the_kernel_cannot_take_stay_dense():
    assert quantized.problem(torch.nn.Linear(64, 32).bfloat16()) == "q4 layers compute in float32"  # as their codes
    assert "tiles" in quantized.problem(torch.nn.Linear(48, 32))
    assert quantized.problem(torch.nn.Linear(64, 32)) is None


def test_packing_takes_plain_linears_and_leaves_q4s_alone():
    """Packing (decoding/packing.py) and q4 both stand in for a layer's forward: packing takes
    the layers nothing else serves, whatever this CPU's packing kernels can do."""
    from mars_cli.decoding import packing

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 64))
    assert packing.packable(model) == [model[0], model[1]]
    model[0].forward = quantized.QuantizedLinear.from_weight(model[0].weight.detach(), None, KERNELS[0]) \
        if KERNELS else (lambda x: x)
    assert packing.packable(model) == [model[1]]


def rounded_like_llamacpp(x: torch.Tensor) -> torch.Tensor:
    """x as llama.cpp's 8-bit activations hold it: each group of 32 as d * round(x / d), d = max|x| / 127."""
    groups = x.double().reshape(*x.shape[:-1], -1, quantized.GROUP)
    step = groups.abs().amax(-1, keepdim=True) / 127
    return (torch.round(groups / torch.where(step > 0, step, 1)) * step).reshape(x.shape)


@pytest.mark.skipif("mars" not in KERNELS, reason="this project's kernels are not built here")
@pytest.mark.parametrize("levels", [16, 32, 64, 256])  # Q4_*; Q5_0/Q5_1/Q5_K; Q6_K; Q8_0
def test_q4a8_is_the_exact_product_with_the_rounded_activations_for_every_code_width(levels):
    """Every term of q4a8's product (codes, offsets, the 8-bit codes' shift) takes the same rounded
    activations, so its error against float32 is llama.cpp's arithmetic's error, whatever the codes'
    width: a float-sum offset term made 5-bit codes 0.16 relative error, 16x llama.cpp's."""
    generator = torch.Generator().manual_seed(levels)
    out_features, in_features = 40, 256
    codes = torch.randint(0, levels, (out_features, in_features), generator=generator, dtype=torch.int32)
    scale = torch.rand(out_features, in_features // quantized.GROUP, generator=generator) * 0.01 + 0.001
    offset = -scale * (levels / 2) + torch.randn(scale.shape, generator=generator) * 0.001
    found = quantized.Codes(codes, scale, offset, quantized.LEVELS_INT4 if levels == 16 else quantized.LEVELS_INT8, True)
    matrix = quantized.CodeMatrix.of(found)
    matrix.activations = 8
    weight = (offset.repeat_interleave(quantized.GROUP, 1) + scale.repeat_interleave(quantized.GROUP, 1) * codes).double()
    x = torch.randn(7, in_features, generator=generator)
    x[:, 5] *= 30  # outlier channels, as real activations have
    x[:, 100] *= -20
    exact = x.double() @ weight.T
    llamacpp = rounded_like_llamacpp(x) @ weight.T
    ours = matrix.product(x).double()
    scale_of_outputs = float(exact.abs().max())
    assert float((ours - llamacpp).abs().max()) <= 1e-5 * scale_of_outputs  # float32 rounding only
    our_error = float((ours - exact).abs().max()) / scale_of_outputs
    llamacpp_error = float((llamacpp - exact).abs().max()) / scale_of_outputs
    assert our_error <= llamacpp_error * 1.01 + 1e-5


def with_an_awkward_group(weight: torch.Tensor, row: int = 3, group: int = 1) -> torch.Tensor:
    """`weight` with one value of one group moved off its grid by an irrational part of a step."""
    awkward = weight.clone()
    values = awkward[row, group * quantized.GROUP:(group + 1) * quantized.GROUP]
    middle = int((values - values.median()).abs().argmin())  # neither the least nor the greatest
    values[middle] += float(values.max() - values.min()) / 255 * 0.3183
    return awkward


@pytest.mark.parametrize("kind, levels", [(GGMLQuantizationType.Q4_1, 16), (GGMLQuantizationType.Q8_0, 256)])
def test_one_awkward_group_is_quantized_afresh_and_the_others_keep_their_codes(kind, levels):
    """Issue 71 item 14: a group the search cannot fit costs that group's precision, at its layer's
    width, not the whole layer's (which became fresh 4-bit codes)."""
    weight = with_an_awkward_group(through_gguf(torch.randn(32, 128, generator=torch.Generator().manual_seed(4)), kind))
    found = quantized.recover(weight)
    assert not found.exact and found.failed == 1 and found.levels == levels
    rebuilt = (found.offset.repeat_interleave(quantized.GROUP, 1)
               + found.scale.repeat_interleave(quantized.GROUP, 1) * found.codes)
    error = (rebuilt - weight).abs().reshape(32, -1, quantized.GROUP).amax(-1)
    assert float(error[3, 1]) > 0  # the awkward group: quantized afresh
    error[3, 1] = 0
    assert float(error.max()) <= 1e-6 * float(weight.abs().max())  # every other group: exact


def test_the_lossy_note_blames_the_search_and_counts_the_groups(tmp_path):
    weight = with_an_awkward_group(through_gguf(torch.randn(32, 128, generator=torch.Generator().manual_seed(4)),
                                                GGMLQuantizationType.Q4_1))
    model = torch.nn.Sequential(torch.nn.Linear(128, 32, bias=False), torch.nn.Linear(128, 32, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(weight)
        model[1].weight.copy_(through_gguf(torch.randn(32, 128), GGMLQuantizationType.Q4_1))
    copy = tmp_path / "q4.safetensors"
    for done in (quantized.install(model, copy), quantized.install(torch.nn.Sequential(*model), copy)):
        assert (done.quantized, done.exact, done.failed, done.groups, done.fresh_bits) == (2, 1, 1, 128, (4,))
        quantized.remove(model)
    line = quantized.lossy_note("q4", done)
    assert done.read and "the codes of 1 of the 128 groups of 32 weights in 1 of 2 linear layers" in line
    assert "could not be recovered from their de-quantized floats" in line and "quantized to 4 bits now (lossy" in line
    assert "no quantized file" not in line
