"""`--packed-weights`: the target's linear layers on weights prepacked for oneDNN (CPU).

On a CPU, torch runs a bfloat16 `F.linear` through oneDNN with the weight in torch's plain layout,
which oneDNN reorders into its blocked layout inside every call: 211 reorders of 270 MB of weights
per forward of SmolLM2-135M. Packing each weight once (`torch.ops.mkldnn._reorder_linear_weight`,
what inductor's weight freezing does) and calling the packed product
(`torch.ops.mkldnn._linear_pointwise`) gives the same numbers without the reorders: on an Intel
Xeon with AMX a forward of SmolLM2 took about 20% less at width 1 and at width 25, and plain
decoding ran 1.13-1.15x faster (docs/benchmarks.md).
Float32 linears are packed the same way. Torch's own float32 product (MKL) slows down sharply past
one row on some CPUs: on an AMD EPYC with AVX2 only a 17-wide forward of SmolLM2 took 2.4x a
one-row one, packed 1.7x (SmolLM2's 49,152-row output layer alone: 23 ms dense at two rows, 4.4
packed), so tree rounds in float32, the exact mode, cost a third less there. The packed product
computes the same sums in another order, as any other kernel for another width does: losslessness
is measured as before (strict greedy against plain decoding, on the same packed weights).

The packed copy is a snapshot: each packed layer checks on every call that its weight is still the
tensor it packed (the dtype chooser swaps weights in place), and otherwise, or when autograd
needs the product, runs `F.linear` as before. Whether packing pays is measured, never assumed,
by the tuning layer (tuning/packing.py); this module only packs.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import KERNEL_FAILURES, first_line

# oneDNN picks its blocking for the rows it is told to expect; 25 (a default 4 x 24 tree round) was
# the best of 1, 16, 25 and 64 for widths 1 and 25 on the Intel Xeon with AMX (docs/benchmarks.md)
PACK_ROWS = 25
PACKED_DTYPES = (torch.bfloat16, torch.float32)
TOLERANCE = 1e-2  # the probe: packed and dense products agree within this (relative to the output's scale)


def packable(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The linear layers packing applies to: bfloat16 and float32 weights on the CPU."""
    return [module for module in model.modules() if isinstance(module, torch.nn.Linear)
            and module.weight.device.type == "cpu" and module.weight.dtype in PACKED_DTYPES
            and not _serves_otherwise(module)]


def _serves_otherwise(layer: torch.nn.Linear) -> bool:
    """Whether another forward than a packed one stands in for the layer's (q4's codes)."""
    forward = layer.__dict__.get("forward")
    return forward is not None and not isinstance(forward, PackedForward)


def problem(model: torch.nn.Module) -> str | None:
    """Why this model's linears cannot run packed here (one sentence), or None: no bfloat16 or float32 linear
    on the CPU, a torch without the oneDNN ops, or a probe whose packed product raises or differs
    from `F.linear`'s."""
    layers = packable(model)
    if not layers:
        return "only bfloat16 and float32 linear layers on the CPU are packed"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return f"torch {torch.__version__} has no oneDNN packed linear product"
    layer = layers[0]
    return product_problem(layer, PACK_ROWS, lambda x: PackedForward(layer, PACK_ROWS).product(x), TOLERANCE,
                           f"torch cannot pack {dtype_name(layer.weight.dtype)} weights on this CPU",
                           "the packed product differs from torch's on this CPU")


def product_problem(layer: torch.nn.Linear, rows: int, product: Callable[[torch.Tensor], torch.Tensor],
                    tolerance: float, cannot: str, differs: str) -> str | None:
    """Why `product` (a stand-in for `layer`'s F.linear: packed here, int8 rows in head/int8.py)
    cannot serve on this machine, probed on `rows` seeded random rows: `cannot` (with the kernel's
    error) when it raises, `differs` when it is off by more than `tolerance` of the output's scale."""
    probe = torch.randn(rows, layer.in_features, generator=torch.Generator().manual_seed(0)).to(layer.weight.dtype)
    try:
        with torch.inference_mode():
            got, expected = product(probe).float(), F.linear(probe, layer.weight, layer.bias).float()
    except KERNEL_FAILURES as exc:
        return f"{cannot} ({first_line(exc)})"
    scale = float(expected.abs().max()) or 1.0
    return None if torch.allclose(got, expected, rtol=0, atol=tolerance * scale) else differs


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def weight_identity(weight: torch.Tensor) -> tuple:
    """What tells a weight's values apart from those packed: its storage, dtype, shape and (outside
    inference tensors, which keep none) its version counter, which every in-place write bumps."""
    version = None if weight.is_inference() else weight._version
    return weight.data_ptr(), weight.dtype, tuple(weight.shape), version


def copy_serves(x: torch.Tensor, weight: torch.Tensor, source: tuple) -> bool:
    """Whether a product on a copy made of `weight` when its identity was `source` (packed here,
    int8 rows in head/int8.py) may stand in for `F.linear(x, weight)`: the weight unchanged, `x`
    of its dtype, and no gradient asked for."""
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return not needs_grad and x.dtype == weight.dtype and weight_identity(weight) == source


class PackedForward:
    """One linear layer's forward on its packed weight, falling back to `F.linear` when the
    weight is no longer what was packed (swapped, cast or written since) or autograd needs the product."""

    def __init__(self, layer: torch.nn.Linear, rows: int) -> None:
        self.layer = layer
        self.source = weight_identity(layer.weight)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), rows)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.layer.bias, "none", [], "")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not copy_serves(x, self.layer.weight, self.source):
            return F.linear(x, self.layer.weight, self.layer.bias)
        return self.product(x)


def install(model: torch.nn.Module, rows: int = PACK_ROWS) -> int:
    """Run every packable linear of `model` on a packed copy of its weight (again after `remove`;
    a layer already packed is left as it is). Returns the layers packed now."""
    return len(_use(_packed_forwards(model, rows)))


def _packed_forwards(model: torch.nn.Module, rows: int) -> list[PackedForward]:
    """A packed forward for each packable linear of `model` (the one it runs already, if packed)."""
    with torch.no_grad():
        return [layer.__dict__["forward"] if isinstance(layer.__dict__.get("forward"), PackedForward)
                else PackedForward(layer, rows) for layer in packable(model)]


def _use(forwards: list[PackedForward]) -> list[PackedForward]:
    """Give each layer its packed forward; returns those that were not in use."""
    fresh = [forward for forward in forwards if forward.layer.__dict__.get("forward") is not forward]
    for forward in fresh:
        forward.layer.forward = forward
    return fresh


class Switch:
    """A model's linears switched between packed and dense without packing again, for timed
    comparisons (here, and the dtype chooser's candidates): on `set(True)` packed if they can be
    (`problem`) in whatever dtype the model's weights are then, each dtype packed once; dense on
    `set(False)`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.forwards: dict[torch.dtype, list[PackedForward]] = {}
        self.refused: dict[torch.dtype, str] = {}  # why a dtype's linears cannot be packed, once tried

    def set(self, packed: bool) -> bool:
        """Packed or dense; returns whether the linears run packed now."""
        remove(self.model)
        layers = packable(self.model)
        if not packed or not layers:
            return False
        dtype = layers[0].weight.dtype
        if dtype not in self.forwards and dtype not in self.refused:
            why = problem(self.model)
            if why is not None:
                self.refused[dtype] = why
            else:
                self.forwards[dtype] = _packed_forwards(self.model, PACK_ROWS)
        if dtype in self.refused:
            return False
        _use(self.forwards[dtype])
        return True


def remove(model: torch.nn.Module) -> None:
    """Every linear of `model` back on `F.linear` (the packed copies are freed)."""
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), PackedForward):
            del module.forward


def installed(model: torch.nn.Module) -> bool:
    """Whether any linear of `model` runs packed."""
    return any(isinstance(module.__dict__.get("forward"), PackedForward) for module in model.modules())
