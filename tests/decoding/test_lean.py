"""The lean forward (decoding/lean.py) and its kernels (layer_ops.cpp, the q4a8 product): the same
numbers as transformers' forward on the same quantized linears, for prefills, chains, draft trees
and kept rows; the kernels against plain torch arithmetic."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mars_cli.decoding import kernels, lean, quantized
from mars_cli.decoding.kv import KVCache
from mars_cli.decoding.target import TargetScorer
from mars_cli.decoding.tree import DraftTree
from mars_cli.models import load_model

pytestmark = pytest.mark.skipif(kernels.problem() is not None, reason=f"no kernels here: {kernels.problem()}")
TOLERANCE = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture
def q4_target(tiny_dir):
    """The tiny Llama with its linears on freshly quantized codes (its own float32 weights are not
    a file's codes: what matters here is that both forwards use the same codes)."""
    target = load_model(str(tiny_dir), device="cpu", dtype="float32")
    quantized.install(target.model)
    target.linears = quantized.QUANTIZED
    return target


def reference(target, ids: torch.Tensor, cache: KVCache, **extra):
    with torch.inference_mode():
        return cache.forward(ids, hidden=True, **extra)


def test_lean_forward_equals_transformers_on_the_same_codes(q4_target):
    forward = lean.lean_forward(q4_target.model)
    assert forward is not None
    theirs, ours = KVCache(q4_target.model), lean.LeanCache(forward)
    feeds = [torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10, 11]]), torch.tensor([[12]]), torch.tensor([[13, 14, 15]])]
    for ids in feeds:  # a prefill, a plain step, a chain of three
        expected = reference(q4_target, ids, theirs)
        with torch.inference_mode():
            got = ours.forward(ids, hidden=True)
        assert torch.allclose(got.logits, expected.logits, **TOLERANCE)
        assert len(got.hidden_states) == len(expected.hidden_states)
        for mine, yours in zip(got.hidden_states, expected.hidden_states):
            assert torch.allclose(mine, yours, **TOLERANCE)
    assert len(ours) == len(theirs) == 13


def test_a_draft_tree_and_its_kept_path_match_transformers(q4_target):
    """A branching tree scored in one pass (its mask and depths), then the accepted branch kept:
    the next step sees the same cache in both forwards."""
    tree = DraftTree(tokens=torch.tensor([20, 21, 22, 23]), parents=torch.tensor([-1, -1, 0, 1]))
    context = torch.tensor([3, 4, 5, 6, 7, 8])
    outputs = {}
    for name, use_lean in (("transformers", False), ("lean", True)):
        scorer = TargetScorer(q4_target)
        if not use_lean:
            scorer._growing_cache = lambda: KVCache(q4_target.model)  # noqa: SLF001 - the reference forward
        scorer.start(context)
        assert isinstance(scorer.cache, lean.LeanCache) == use_lean
        scored = scorer.score(torch.tensor([9]), tree, width=5)
        scorer.keep([0, 2, 4])  # pending, then draft 21 (row 2) and its child 23 (row 4)
        after = scorer.score(torch.tensor([30]), DraftTree.empty("cpu"), width=1)
        outputs[name] = (scored.logits, after.logits)
    for mine, yours in zip(outputs["lean"], outputs["transformers"]):
        assert torch.allclose(mine, yours, **TOLERANCE)


def test_the_lean_forward_follows_the_models_linears(q4_target, tiny_target):
    assert lean.lean_forward(tiny_target.model) is None  # dense linears: transformers' forward
    first = lean.lean_forward(q4_target.model)
    assert lean.lean_forward(q4_target.model) is first  # built once
    quantized.use_activations(q4_target.model, quantized.QUANTIZED_A8)
    switched = lean.lean_forward(q4_target.model)
    assert switched is not first and switched.activations == 8
    quantized.remove(q4_target.model)
    assert lean.lean_forward(q4_target.model) is None


@pytest.mark.parametrize("change, reason", [({"model_type": "gemma3_text"}, "serves llama"),
                                            ({"hidden_act": "gelu"}, "SiLU"),
                                            ({"sliding_window": 64}, "sliding-window")])
def test_other_architectures_keep_transformers_forward(q4_target, change, reason):
    config = q4_target.model.config
    saved = {key: getattr(config, key, None) for key in change}
    try:
        for key, value in change.items():
            setattr(config, key, value)
        assert reason in lean.problem(q4_target.model)
    finally:
        for key, value in saved.items():
            setattr(config, key, value)
    assert lean.problem(q4_target.model) is None


def test_rms_norm_and_silu_mul_match_torch():
    torch.manual_seed(0)
    x, weight = torch.randn(3, 40), torch.randn(40)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight
    assert torch.allclose(torch.ops.mars.rms_norm(x, weight, 1e-5), expected, **TOLERANCE)
    gate_up = torch.randn(2, 5, 48)
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.allclose(torch.ops.mars.silu_mul(gate_up), F.silu(gate) * up, **TOLERANCE)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("width", [1, 4])
def test_attend_matches_sdpa_with_rotary_embeddings_and_the_cache(width, masked):
    torch.manual_seed(width)
    heads, kv_heads, d, past, capacity = 6, 2, 16, 5, 16
    keys, values = torch.zeros(1, kv_heads, capacity, d), torch.zeros(1, kv_heads, capacity, d)
    keys[:, :, :past], values[:, :, :past] = torch.randn(1, kv_heads, past, d), torch.randn(1, kv_heads, past, d)
    qkv = torch.randn(width, (heads + 2 * kv_heads) * d)
    angles = torch.randn(width, d // 2).repeat(1, 2)
    cos, sin = angles.cos(), angles.sin()
    bias = None
    if masked:  # a tree: row i sees the past and the rows up to i of the same parity
        allowed = torch.ones(width, past + width, dtype=torch.bool)
        for i in range(width):
            for j in range(width):
                allowed[i, past + j] = j <= i and (i - j) % 2 == 0
        bias = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    expected_keys, expected_values = keys.clone(), values.clone()
    out = torch.ops.mars.attend(qkv, cos, sin, keys, values, past, heads, kv_heads, bias)

    split = qkv.view(width, heads + 2 * kv_heads, d).transpose(0, 1)
    q = rotate(split[:heads], cos, sin)
    expected_keys[0, :, past:past + width] = rotate(split[heads:heads + kv_heads], cos, sin)
    expected_values[0, :, past:past + width] = split[heads + kv_heads:]
    assert torch.allclose(keys, expected_keys, **TOLERANCE) and torch.equal(values, expected_values)
    if bias is None:
        allowed = torch.ones(width, past + width, dtype=torch.bool).tril(past)
        bias = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    expected = F.scaled_dot_product_attention(q[None], expected_keys[:, :, :past + width],
                                              expected_values[:, :, :past + width], attn_mask=bias,
                                              enable_gqa=True)
    assert torch.allclose(out, expected[0].transpose(0, 1).reshape(width, heads * d), **TOLERANCE)


def a8_reference(x: torch.Tensor, found: quantized.Codes) -> torch.Tensor:
    """The q4a8 product in plain torch: each group of 32 inputs rounded to int8 codes with scale
    max|x| / 127, then multiplied by the dequantised weights: every term (codes, offsets, the 8-bit
    codes' shift by 128) takes the same rounded inputs, as llama.cpp's Q8_1 sums do."""
    groups = x.reshape(-1, x.shape[-1] // 32, 32)
    peak = groups.abs().amax(-1, keepdim=True)
    inputs = torch.where(peak > 0, torch.round(groups * (127 / peak)), torch.zeros_like(groups)) * (peak / 127)
    weight = found.offset.repeat_interleave(32, dim=1) + found.scale.repeat_interleave(32, dim=1) * found.codes.float()
    return inputs.reshape(-1, x.shape[-1]) @ weight.T


@pytest.mark.parametrize("levels", [quantized.LEVELS_INT4, quantized.LEVELS_INT8])
@pytest.mark.parametrize("rows", [1, 3, 6])
@pytest.mark.parametrize("groups", [3, 4])  # an odd count: the one-row loop's tail
def test_the_q4a8_product_is_the_integer_product_of_8_bit_activations(levels, rows, groups):
    torch.manual_seed(levels + rows)
    weight, x = torch.randn(32, 32 * groups), torch.randn(rows, 32 * groups)
    x[0, :32] = 0.0  # an all-zero group: scale 0, no division by it
    found = quantized.recover(weight, levels, search=False)
    matrix = quantized.CodeMatrix.of(found)
    matrix.activations = 8
    assert torch.allclose(matrix.product(x), a8_reference(x, found), rtol=1e-4, atol=1e-3)
    exact = x @ (found.offset.repeat_interleave(32, 1) + found.scale.repeat_interleave(32, 1) * found.codes).T
    assert (matrix.product(x) - exact).abs().max() < 0.05 * exact.abs().max()  # 8-bit inputs: near, not equal


def test_fused_projections_compute_each_ones_outputs(q4_target):
    attention = q4_target.model.model.layers[0].self_attn
    projections = [attention.q_proj, attention.k_proj, attention.v_proj]
    fused = lean.fused(projections)
    x = torch.randn(2, attention.q_proj.in_features)
    with torch.inference_mode():
        assert torch.allclose(fused(x), torch.cat([p(x) for p in projections], dim=-1), **TOLERANCE)


def test_q4a8_rows_do_not_depend_on_how_they_are_fed(q4_target):
    """8-bit activations turn a last-bit difference into a different rounding, and so in the end a
    different token: under q4a8 a row's hidden states must be bit for bit the same whether it is fed
    alone, in a chain, or as a tree's node (its ancestors before it), or strict verification would
    not reproduce plain decoding. (The tiny model's output layer is dense: its logits may differ in
    the last bit with the width, as float32's do, without anything after them to amplify it.)"""
    quantized.use_activations(q4_target.model, quantized.QUANTIZED_A8)
    forward = lean.lean_forward(q4_target.model)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]])
    with torch.inference_mode():
        wide = lean.LeanCache(forward)
        wide.forward(ids[:, :8])
        chain = wide.forward(ids[:, 8:], hidden=True).hidden_states
        single = lean.LeanCache(forward)
        single.forward(ids[:, :8])
        alone = [single.forward(ids[:, i:i + 1], hidden=True).hidden_states for i in range(8, ids.shape[1])]
    for layer, states in enumerate(chain):
        assert torch.equal(states[0], torch.cat([step[layer][0] for step in alone])), f"layer {layer}"

    layers = (1, -1)  # a middle layer's output and the final normed state
    context = torch.tensor([3, 4, 5, 6, 7, 8])
    tree = DraftTree(tokens=torch.tensor([20, 21, 22, 23]), parents=torch.tensor([-1, -1, 0, 1]))
    branching = TargetScorer(q4_target, layers)
    branching.start(context)
    scored = branching.score(torch.tensor([9]), tree, width=5).features
    plain = TargetScorer(q4_target, layers)
    plain.start(torch.cat([context, torch.tensor([9, 21])]))  # the branch 21 -> 23, decoded plainly
    assert torch.equal(scored[4], plain.score(torch.tensor([23]), DraftTree.empty("cpu"), width=1).features[0])


LONG = (torch.arange(lean.PROMPT_ROWS + 16) % 37 + 3)[None]  # a prompt long enough for the dense path


@pytest.mark.parametrize("mode", [quantized.QUANTIZED, quantized.QUANTIZED_A8])
def test_a_long_prompt_runs_on_dense_kernels_and_decoding_goes_on_from_its_cache(q4_target, mode):
    """A prompt of PROMPT_ROWS or more: the codes' float values in dense products and fused causal
    attention, the last row's logits only. Its cache and hidden states are transformers' on the
    same codes (to float32 rounding), and the steps after it see the same cache."""
    quantized.use_activations(q4_target.model, mode)
    forward = lean.lean_forward(q4_target.model)
    with torch.inference_mode():
        ours = lean.LeanCache(forward)
        got = ours.forward(LONG, hidden=True, prompt=True)
        quantized.use_activations(q4_target.model, quantized.QUANTIZED)  # the reference: float32 products
        theirs = KVCache(q4_target.model)
        expected = theirs.forward(LONG, hidden=True)
    assert got.logits.shape == (1, 1, expected.logits.shape[-1])
    assert torch.allclose(got.logits[0, 0], expected.logits[0, -1], **TOLERANCE)
    for mine, yours in zip(got.hidden_states, expected.hidden_states, strict=True):
        assert torch.allclose(mine, yours, **TOLERANCE)
    with torch.inference_mode():  # a chain after it: ours on the mode's kernels, the reference in float32 products
        step = torch.tensor([[40, 41, 42]])
        after, reference_after = ours.forward(step).logits, theirs.forward(step).logits
    if mode == quantized.QUANTIZED:
        assert torch.allclose(after, reference_after, **TOLERANCE)
    else:  # 8-bit activations: near, not equal
        assert (after - reference_after).abs().max() < 0.05 * reference_after.abs().max()


def test_a_short_prompt_and_decoding_rows_keep_the_kernels_arithmetic(q4_target):
    """Below PROMPT_ROWS, or after the first rows, or with a mask, every row runs on the kernels:
    the same bits as a plain forward of it (q4a8's guarantee holds for every row decoding feeds)."""
    quantized.use_activations(q4_target.model, quantized.QUANTIZED_A8)
    forward = lean.lean_forward(q4_target.model)
    short = LONG[:, : lean.PROMPT_ROWS - 1]
    with torch.inference_mode():
        flagged = lean.LeanCache(forward).forward(short, hidden=True, prompt=True).hidden_states
        plain = lean.LeanCache(forward).forward(short, hidden=True).hidden_states
    assert all(torch.equal(a, b) for a, b in zip(flagged, plain, strict=True))


def test_strict_q4a8_after_a_long_prompt_reproduces_plain_q4a8(q4_target):
    """Plain decoding and verification feed the prompt the same way (the dense path), then every
    row on the kernels: a token scored in a chain has the bits it has decoded alone."""
    quantized.use_activations(q4_target.model, quantized.QUANTIZED_A8)
    layers = (1, -1)
    chained, single = TargetScorer(q4_target, layers), TargetScorer(q4_target, layers)
    chained.start(LONG[0])
    single.start(LONG[0])
    chain = DraftTree(tokens=torch.tensor([50, 51]), parents=torch.tensor([-1, 0]))
    scored = chained.score(torch.tensor([49]), chain, width=3).features
    steps = [single.score(torch.tensor([token]), DraftTree.empty("cpu"), width=1).features[0] for token in (49, 50, 51)]
    for row, alone in enumerate(steps):
        assert torch.equal(scored[row], alone), f"row {row}"
        single.keep([0])


def test_projections_of_different_code_widths_are_fused_at_the_wider_one(q4_target):
    """A K-quant file's layer: q and k in 4-bit codes, v in 8-bit ones. The layer stays on the lean
    forward (q and k widened to 8-bit codes of the same values) with transformers' numbers."""
    for layer in q4_target.model.model.layers:
        v_proj = layer.self_attn.v_proj
        v_proj.forward = quantized.QuantizedLinear.from_codes(
            quantized.recover(v_proj.weight, quantized.LEVELS_INT8, search=False), v_proj.bias)
    forward = lean.lean_forward(q4_target.model)
    assert forward is not None and forward.layers[0].bits[0] == 8
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])
    expected = reference(q4_target, ids, KVCache(q4_target.model))
    with torch.inference_mode():
        got = lean.LeanCache(forward).forward(ids, hidden=True)
    assert torch.allclose(got.logits, expected.logits, **TOLERANCE)
