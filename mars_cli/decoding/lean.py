"""A lean forward for Llama-family targets on the CPU, with its own preallocated cache.

A q4 decoding step of SmolLM2-135M spent about as long in transformers' eager forward around the
linears (dozens of small operations a layer, a cache that concatenates every step, masks built
per call) as in the linears themselves (docs/benchmarks.md). This forward does the same
arithmetic with the fewest operations: q, k and v in one quantized product, gate and up in
another, rotary embeddings on q and k together, keys and values written into a preallocated
cache, one `scaled_dot_product_attention` a layer. It serves the quantized modes (`--dtype q4`,
`q4a8`), where the linears are already ours; dense modes keep transformers' forward, whose
float32 tokens the CI baseline pins.

Supported: Llama, Mistral and Qwen2 configurations without sliding windows (rms norms, rotary
embeddings, grouped-query attention, a SiLU-gated MLP, optional q/k/v biases). `problem(model)`
says why another model keeps transformers' forward.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Sequence

import torch

from ..models import text_config
from .quantized import CodeMatrix, QuantizedLinear

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
CACHE_BLOCK = 256  # the cache grows in whole blocks: few reallocations over a sequence


def problem(model: torch.nn.Module) -> str | None:
    """Why `model` cannot run on the lean forward (one phrase), or None."""
    config = text_config(model)
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_TYPES:
        return f"the lean forward serves {', '.join(SUPPORTED_TYPES)} models, not {kind}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"the lean forward computes SiLU-gated MLPs, not {config.hidden_act}"
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", kind != "qwen2"):
        return "the lean forward does not serve sliding-window attention"
    if next(model.parameters()).device.type != "cpu":
        return "the lean forward runs on the CPU"
    from . import kernels

    if not kernels.loaded():  # every op it calls registered, not merely a library loaded
        return "the lean forward runs on this project's kernels, not loaded here"
    return None


def fused(projections: Sequence[torch.nn.Linear]) -> QuantizedLinear | None:
    """One quantized product computing `projections` side by side (their outputs concatenated),
    or None where one of them does not run on this project's kernel with the others' bits."""
    forwards = [projection.__dict__.get("forward") for projection in projections]
    if not all(isinstance(f, QuantizedLinear) and len(f.matrices) == 1 and isinstance(f.matrices[0], CodeMatrix)
               for f in forwards):
        return None
    matrices = [f.matrices[0] for f in forwards]
    if len({m.activations for m in matrices}) != 1:
        return None
    if len({m.bits for m in matrices}) != 1:  # a K-quant file's q and k in 4 bits beside v in more
        matrices = [widened(m) for m in matrices]
    matrix = CodeMatrix(torch.cat([m.codes for m in matrices]), torch.cat([m.scale for m in matrices]),
                        torch.cat([m.offset for m in matrices]), matrices[0].bits, matrices[0].activations)
    biases = [f.bias for f in forwards]
    if all(b is None for b in biases):
        bias = None
    else:
        bias = torch.cat([b if b is not None else torch.zeros(p.out_features) for b, p in zip(biases, projections)])
    return QuantizedLinear([matrix], bias, all(f.exact for f in forwards), forwards[0].levels)


def widened(matrix: CodeMatrix) -> CodeMatrix:
    """4-bit codes as 8-bit ones, the same values, scales and offsets: projections of different code
    widths are fused at the wider one (reading the narrower's codes twice the bytes) rather than
    leaving the lean forward for transformers' eager one."""
    if matrix.bits == 8:
        return matrix
    return CodeMatrix(matrix.unpacked().contiguous(), matrix.scale, matrix.offset, 8, matrix.activations)


def matrix_of(projection: torch.nn.Module) -> CodeMatrix | None:
    """The one code matrix a linear runs on (this project's kernel), or None."""
    forward = projection.__dict__.get("forward")
    if isinstance(forward, QuantizedLinear) and len(forward.matrices) == 1 and isinstance(forward.matrices[0], CodeMatrix):
        return forward.matrices[0]
    return None


PROMPT_ROWS = 64  # a prompt of this many rows or more is fed on dense kernels (LeanForward.prompt)


def dense_weight(linear: torch.nn.Linear) -> torch.Tensor:
    """The float weight a quantized linear's codes stand for: its own where the codes reproduce it
    (a quantized file's), else the codes' values (groups quantized afresh)."""
    forward = linear.__dict__.get("forward")
    if not isinstance(forward, QuantizedLinear) or forward.exact:
        return linear.weight
    matrix = forward.matrices[0]
    return matrix.dequantized()


def dense_product(x: torch.Tensor, linears: Sequence[torch.nn.Linear]) -> torch.Tensor:
    """x through `linears` side by side (their outputs concatenated), on torch's dense kernels."""
    outputs = []
    for linear in linears:
        forward = linear.__dict__.get("forward")
        bias = forward.bias if isinstance(forward, QuantizedLinear) else linear.bias
        outputs.append(torch.nn.functional.linear(x, dense_weight(linear), bias))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)


def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [n, heads, d] with the rotary embedding (rotate-half convention; cos, sin [n, d])."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + turned * sin[:, None]


@dataclass
class Layer:
    """One decoder layer as `mars::decoder_layer` takes it: norms, and each linear as [codes,
    scale, offset] or [codes, scale, offset, bias], with their code widths."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    linears: tuple[list[torch.Tensor], ...]  # qkv, output, gate_up, down
    bits: list[int]


def layer_linear(forward: QuantizedLinear) -> tuple[list[torch.Tensor], int]:
    matrix = forward.matrices[0]
    parts = [matrix.codes, matrix.scale, matrix.offset]
    return (parts + [forward.bias] if forward.bias is not None else parts), matrix.bits


class LeanForward:
    """The target's forward, for a model whose decoder layers' linears all run on this project's
    kernel: one `mars::decoder_layer` call a layer."""

    def __init__(self, model: torch.nn.Module) -> None:
        config = text_config(model)
        self.model = model
        inner = model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = inner.norm
        self.head = model.lm_head
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = float(config.rms_norm_eps)
        self.layers: list[Layer] = []
        self.dense: list[tuple[list[torch.nn.Linear], ...]] = []  # each layer's qkv, output, gate_up and down linears
        activations = set()
        for layer in inner.layers[: config.num_hidden_layers]:
            attention, mlp = layer.self_attn, layer.mlp
            qkv = fused([attention.q_proj, attention.k_proj, attention.v_proj])
            gate_up = fused([mlp.gate_proj, mlp.up_proj])
            output, down = matrix_of(attention.o_proj), matrix_of(mlp.down_proj)
            if qkv is None or gate_up is None or output is None or down is None:
                raise ValueError("the lean forward needs every linear of a layer on this project's kernel")
            found = [layer_linear(f) for f in (qkv, attention.o_proj.forward, gate_up, mlp.down_proj.forward)]
            activations |= {qkv.matrices[0].activations, output.activations, gate_up.matrices[0].activations,
                            down.activations}
            self.layers.append(Layer(layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach(),
                                     tuple(parts for parts, _ in found), [bits for _, bits in found]))
            self.dense.append(([attention.q_proj, attention.k_proj, attention.v_proj], [attention.o_proj],
                               [mlp.gate_proj, mlp.up_proj], [mlp.down_proj]))
        if len(activations) != 1:
            raise ValueError("the lean forward needs one activation width for every layer")
        self.activations = activations.pop()
        self.signature = signature(model)

    def prompt(self, ids: torch.Tensor, cache: "LeanCache", positions: torch.Tensor,
               hidden: bool) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """A prompt of PROMPT_ROWS or more into an empty cache, on dense kernels: each linear's
        float weight (its codes' values, `dense_weight`) in one matrix product for all the rows, and
        torch's fused causal attention; the logits of the last row only. Decoding rows keep the
        kernels' per-row arithmetic (bit for bit the same however they are fed); a prompt, fed
        the same way by plain decoding and by verification, need not, and its cost is a
        dense product's, not (rows x the kernels' per-row cost) plus a quadratic attention."""
        width = ids.shape[1]
        cache.reserve(width)
        x = self.embed(ids)[0]
        states = [x[None]] if hidden else None
        cos, sin = self.rotary(x[None], positions)
        for index, layer in enumerate(self.layers):
            x = self._prompt_layer(index, layer, x, cos[0], sin[0], cache)
            if states is not None:
                states.append(x[None])
        cache.length = width
        x = torch.ops.mars.rms_norm(x, self.norm.weight, self.eps)
        if states is not None:
            states[-1] = x[None]
        return self.head(x[-1:])[None], states

    def _prompt_layer(self, index: int, layer: "Layer", x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      cache: "LeanCache") -> torch.Tensor:
        """One decoder layer over a whole prompt (see `prompt`): norms and gating on this project's
        ops, linears and attention on torch's dense kernels."""
        width, d = x.shape[0], self.head_dim
        qkv = dense_product(torch.ops.mars.rms_norm(x, layer.input_norm, self.eps), self.dense[index][0])
        q, k, v = qkv.split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q = rotated(q.reshape(width, self.heads, d), cos, sin).transpose(0, 1)
        k = rotated(k.reshape(width, self.kv_heads, d), cos, sin).transpose(0, 1)
        v = v.reshape(width, self.kv_heads, d).transpose(0, 1)
        cache.keys[index][0, :, :width] = k
        cache.values[index][0, :, :width] = v
        attended = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                                                    enable_gqa=self.heads != self.kv_heads)
        x = x + dense_product(attended[0].transpose(0, 1).reshape(width, self.heads * d), self.dense[index][1])
        gated = torch.ops.mars.silu_mul(dense_product(torch.ops.mars.rms_norm(x, layer.post_norm, self.eps),
                                                      self.dense[index][2]))
        return x + dense_product(gated, self.dense[index][3])

    def __call__(self, ids: torch.Tensor, cache: "LeanCache", positions: torch.Tensor, mask: torch.Tensor | None,
                 hidden: bool) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Feed `ids` ([1, n]) at `positions` ([1, n]) after the cache's rows; `mask`: a float bias
        [1, 1, n, past + n] (None: causal). Returns the logits [1, n, V] and, with `hidden`, the
        hidden states as transformers lists them (the embeddings, each layer's output, the last
        one normed)."""
        width = ids.shape[1]
        past = cache.length
        cache.reserve(past + width)
        layer_op = torch.ops.mars.decoder_layer
        x = self.embed(ids)[0]  # [n, hidden]
        states = [x[None]] if hidden else None
        cos, sin = self.rotary(x[None], positions)
        if mask is not None:
            mask = mask.reshape(width, -1)[:, : past + width].contiguous()
        for index, layer in enumerate(self.layers):
            qkv, output, gate_up, down = layer.linears
            x = layer_op(x, layer.input_norm, layer.post_norm, self.eps, qkv, output, gate_up, down, layer.bits,
                         self.activations, cos, sin, cache.keys[index], cache.values[index], past, self.heads,
                         self.kv_heads, mask)
            if states is not None:
                states.append(x[None])
        cache.length = past + width
        x = torch.ops.mars.rms_norm(x, self.norm.weight, self.eps)
        if states is not None:
            states[-1] = x[None]
        return self.head(x)[None], states


class LeanCache:
    """The lean forward's keys and values: [layers] of [1, kv heads, capacity, head dim] tensors,
    the first `length` rows in use. Grows in blocks; `truncate` and `keep` as `kv.KVCache`."""

    def __init__(self, lean: LeanForward) -> None:
        self.lean = lean
        self.length = 0
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def __len__(self) -> int:
        return self.length

    def reserve(self, needed: int) -> None:
        """Room for `needed` rows, keeping the rows in use."""
        if needed <= self.capacity:
            return
        capacity = -(-needed // CACHE_BLOCK) * CACHE_BLOCK
        lean = self.lean
        shape = (1, lean.kv_heads, capacity, lean.head_dim)
        grown_keys, grown_values = [], []
        for index in range(len(lean.layers)):
            keys, values = torch.empty(shape), torch.empty(shape)
            if self.length:
                keys[:, :, : self.length] = self.keys[index][:, :, : self.length]
                values[:, :, : self.length] = self.values[index][:, :, : self.length]
            grown_keys.append(keys)
            grown_values.append(values)
        self.keys, self.values, self.capacity = grown_keys, grown_values, capacity

    def forward(self, input_ids: torch.Tensor, hidden: bool = False, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, prompt: bool = False) -> "LeanOutput":
        """As `kv.KVCache.forward`: `input_ids` [1, n] after the cached rows. `prompt`: a sequence's
        first rows, whose logits only the last row's are wanted (LeanForward.prompt, when long)."""
        if position_ids is None:
            position_ids = torch.arange(self.length, self.length + input_ids.shape[1])[None]
        if prompt and self.length == 0 and attention_mask is None and input_ids.shape[1] >= PROMPT_ROWS:
            logits, states = self.lean.prompt(input_ids, self, position_ids, hidden)
            return LeanOutput(logits, states)
        logits, states = self.lean(input_ids, self, position_ids, attention_mask, hidden)
        return LeanOutput(logits, states)

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def keep(self, indices: Sequence[int] | torch.Tensor) -> None:
        """Exactly the rows `indices` (ascending), in that order: the rows after the longest kept
        prefix are gathered into place, in every layer."""
        indices = torch.as_tensor(indices, dtype=torch.long)
        count = indices.numel()
        if count and (not bool((indices[1:] > indices[:-1]).all()) or int(indices[-1]) >= self.length):
            raise ValueError("keep: indices must be ascending positions inside the cache")
        in_place = indices == torch.arange(count)
        prefix = int(in_place.long().cumprod(0).sum())
        if prefix < count:
            sources = indices[prefix:]
            for tensors in (self.keys, self.values):
                for tensor in tensors:
                    tensor[:, :, prefix:count] = tensor.index_select(2, sources)
        self.length = count


@dataclass
class LeanOutput:
    """What `LeanCache.forward` returns: the fields of a transformers output the scorer reads."""

    logits: torch.Tensor
    hidden_states: list[torch.Tensor] | None


def signature(model: torch.nn.Module) -> tuple:
    """The identity of the model's quantized forwards and their activations' bits: a lean forward
    built on others is stale."""
    found = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            forward = module.__dict__.get("forward")
            bits = tuple(getattr(m, "activations", None) for m in getattr(forward, "matrices", ()))
            found.append((id(forward), bits))
    return tuple(found)


_built: "weakref.WeakKeyDictionary[torch.nn.Module, LeanForward]" = weakref.WeakKeyDictionary()


def lean_forward(model: torch.nn.Module) -> LeanForward | None:
    """The lean forward for `model` as its linears are now, or None where it does not apply (a
    dense model, or one `problem` names). Built once per set of quantized forwards."""
    current = _built.get(model)
    if current is not None and current.signature == signature(model):
        return current
    if problem(model) is not None:
        return None
    try:
        built = LeanForward(model)
    except ValueError:
        return None
    _built[model] = built
    return built
