"""bfloat16 linear layers on the CPU with their weights laid out for oneDNN once, not every call.

PyTorch's bfloat16 `F.linear` on a CPU hands the weight to oneDNN, which first copies it into its
blocked layout, on every call: for a decoding step of a small model, whose matrices are read once
per token, that copy is a large part of the step. Reordered once (`torch.ops.mkldnn`'s
`_reorder_linear_weight`, the op torch.compile's CPU backend uses for the same purpose), a decoding
step of SmolLM2-135M in bfloat16 on an Intel Xeon with AMX took 28.7 ms instead of 36.0 (float32:
33.8) and a 17-wide tree verification 43.9 instead of 53.3 (docs/benchmarks.md, "Packed bfloat16
weights").

It changes no output: the packed kernel is used only for inputs of at most MAX_ROWS rows (decoding
steps and tree verifications; a prefill takes `F.linear`), and only for weight shapes where it was
checked, on this machine, to give bit-identical results to `F.linear` for one row and for
MAX_ROWS rows (`_agrees`); anywhere else, and whenever autograd is on, `F.linear` runs as before.
So `--dtype bfloat16` decodes the same tokens packed or not, only faster where oneDNN's packed
path is (the dtype `auto` chooses is timed with it: dtype_choice.py).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

MAX_ROWS = 32  # widest input the packed kernel takes (checked identical up to here; wider: F.linear)


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this torch has oneDNN's packed linear ops for the CPU."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return callable(torch.ops.mkldnn._reorder_linear_weight) and callable(torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, 1)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@functools.lru_cache(maxsize=None)
def _agrees(in_features: int, out_features: int, has_bias: bool) -> bool:
    """On random bfloat16 data of this shape, the packed kernel equals `F.linear` bit for bit at
    one row and at MAX_ROWS rows (and runs at all). Checked once per shape in a process."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=generator).bfloat16()
    bias = torch.randn(out_features, generator=generator).bfloat16() if has_bias else None
    try:
        packed = _pack(weight)
        for rows in (1, MAX_ROWS):
            x = torch.randn(rows, in_features, generator=generator).bfloat16()
            if not torch.equal(_packed_linear(x, packed, bias), F.linear(x, weight, bias)):
                return False
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


class PackedLinear(nn.Linear):
    """An `nn.Linear` (same parameters, shared, so tied weights, state dicts and fingerprints are
    unchanged) whose bfloat16 CPU forward without autograd uses a once-reordered copy of its weight.
    The copy is remade when the weight changes: another tensor (a cast, the dtype probe's swaps),
    or the same one written in place (its version counter)."""

    # (the weight packed, held so that no other tensor can take its address; its version; the copy)
    _packed: tuple[torch.Tensor, int, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if (weight.dtype is not torch.bfloat16 or x.dtype is not torch.bfloat16 or weight.device.type != "cpu"
                or torch.is_grad_enabled() or not 0 < x.numel() <= MAX_ROWS * x.shape[-1]
                or torch.compiler.is_compiling()  # a compiled graph packs weights its own way
                or not _agrees(self.in_features, self.out_features, self.bias is not None)):
            return F.linear(x, weight, self.bias)
        packed = self._packed
        if packed is None or packed[0].data_ptr() != weight.data_ptr() or packed[1] != weight._version:
            packed = self._packed = (weight.detach(), weight._version, _pack(weight.detach()))
        rows = x.reshape(-1, x.shape[-1])
        out = _packed_linear(rows, packed[2], None if self.bias is None else self.bias.detach())
        return out.reshape(*x.shape[:-1], self.out_features)


def pack_linears(model: nn.Module) -> int:
    """Make every `nn.Linear` in `model` a `PackedLinear` sharing its parameters (a no-op where
    torch lacks the ops); returns how many were swapped."""
    if not available():
        return 0
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                packed = PackedLinear.__new__(PackedLinear)
                packed.__dict__.update(child.__dict__)  # the same Parameter objects, hooks and flags
                packed._parameters = dict(child._parameters)
                setattr(parent, name, packed)
                swapped += 1
    return swapped
