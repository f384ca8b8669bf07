"""`--int8-head`: a draft head's linear layers on int8 weights (CPU).

Inside a round the target's pass (270 MB for SmolLM2-135M) evicts the head's ~20 MB of weights
from the CPU's caches, so the round's first head step reads them from memory again. Each linear's
rows stored as int8 with one scale per row (symmetric, the row's largest magnitude maps to 127)
halve those bytes, and torch's weight-only int8 product (`torch._weight_int8pack_mm`, what
gpt-fast's int8 weights run on the CPU) reads them. Measured on an AMD EPYC (docs/head.md): a
quarter to a third off a round's drafting against dense bfloat16 linears, 2-7% against packed ones
(the rest of a step is small operations int8 does not touch).
The drafts may change slightly (the head's scores are rounded differently); the output cannot:
verification decides every token against the target (docs/head.md measures the acceptance).

Bfloat16 and float32 heads on the CPU. The product runs on bfloat16 activations whatever the
head's dtype (a float32 head's are cast, its outputs cast back): the kernel's float32 path was 3x
slower than float32's own product on the AMD EPYC it was measured on, while a float32 head on int8
rows drafted a round in a third of its float32 time there. Drafts never touch the output, so a
float32 session stays exact. Whether int8 pays is measured, never assumed, by the tuning layer
(tuning/int8.py); this module only quantizes. A layer whose weight changes after it was quantized (the dtype chooser
swaps weights in place) or whose product autograd needs runs its previous forward again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..decoding import packing

HEAD_DTYPES = (torch.bfloat16, torch.float32)  # the heads int8 rows serve
ACTIVATIONS = torch.bfloat16  # what the int8 product multiplies them with
# the kernel reads the inputs' last dimension in vector blocks: widths that are not a multiple of 8
# crashed the process in torch 2.13 (not an exception); 32 leaves room for wider vectors
WIDTH_MULTIPLE = 32
TOLERANCE = 0.03  # the probe: int8 and full products agree within this (relative to the output's scale)
FRONTIER = 4  # rows of the probe: a tree level's frontier


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of `weight` [out, in] as int8 and one bfloat16 scale per row (the kernel takes scales in
    its activations' dtype): row * 127 / max |row|, rounded. An all-zero row keeps a tiny scale."""
    rows = weight.detach().float()
    scales = rows.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    quantized = torch.round(rows / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return quantized, scales.to(ACTIVATIONS)


def eligible(head: torch.nn.Module) -> list[torch.nn.Linear]:
    """The linears int8 applies to: bfloat16 or float32 weights on the CPU, inputs a multiple of
    WIDTH_MULTIPLE wide."""
    return [module for module in head.modules() if isinstance(module, torch.nn.Linear)
            and module.weight.device.type == "cpu" and module.weight.dtype in HEAD_DTYPES
            and module.in_features % WIDTH_MULTIPLE == 0]


def problem(head: torch.nn.Module) -> str | None:
    """Why this head's linears cannot run on int8 weights here (one sentence), or None."""
    layers = eligible(head)
    if not layers:
        return "only a bfloat16 or float32 head on the CPU drafts on int8 weights"
    if not hasattr(torch, "_weight_int8pack_mm"):
        return f"torch {torch.__version__} has no weight-only int8 product"
    if not all(bool(torch.isfinite(layer.weight).all()) for layer in layers):
        # rounded to int8 they would turn finite, hiding a broken head from the drafter's NaN check
        return "the draft head's weights are not all finite"
    layer = layers[0]
    return packing.product_problem(layer, FRONTIER, lambda x: Int8Forward(layer).product(x), TOLERANCE,
                                   "torch cannot multiply by int8 weights on this CPU",
                                   "the int8 product differs from the full-precision one on this CPU")


class Int8Forward:
    """One linear layer's forward on int8 rows, falling back to the forward it had before (dense
    or packed) when its weight is no longer what was quantized or autograd needs the product."""

    def __init__(self, layer: torch.nn.Linear) -> None:
        self.layer = layer
        self.previous = layer.__dict__.get("forward")  # a packed forward (packing.py), or None: F.linear
        self.source = packing.weight_identity(layer.weight)
        self.rows, self.scales = quantize(layer.weight)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(ACTIVATIONS).contiguous()
        out = torch._weight_int8pack_mm(flat, self.rows, self.scales).to(x.dtype)
        out = out.reshape(*x.shape[:-1], self.rows.shape[0])
        return out if self.layer.bias is None else out + self.layer.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not packing.copy_serves(x, self.layer.weight, self.source):
            return self.previous(x) if self.previous is not None else F.linear(x, self.layer.weight, self.layer.bias)
        return self.product(x)


def install(head: torch.nn.Module) -> int:
    """Run every eligible linear of `head` on int8 rows (a layer already on them is left as it
    is). Returns the layers switched now."""
    fresh = [layer for layer in eligible(head) if not isinstance(layer.__dict__.get("forward"), Int8Forward)]
    with torch.no_grad():
        for layer in fresh:
            layer.forward = Int8Forward(layer)
    return len(fresh)


def remove(head: torch.nn.Module) -> None:
    """Every linear of `head` back on the forward it had before `install` (the int8 rows freed)."""
    for module in head.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, Int8Forward):
            if forward.previous is None:
                del module.forward
            else:
                module.forward = forward.previous


def installed(head: torch.nn.Module) -> bool:
    """Whether any linear of `head` runs on int8 rows."""
    return any(isinstance(module.__dict__.get("forward"), Int8Forward) for module in head.modules())
