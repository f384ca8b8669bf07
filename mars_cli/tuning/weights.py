"""A model's weights in another dtype, in place: converted for good (`convert`), or switched
between dtypes for a measurement (`Weights`), one copy per dtype, never loaded twice."""

from __future__ import annotations

from pathlib import Path

import torch

from ..decoding import quantized
from ..models import DTYPES, LoadedModel, convert_weights, kept_in_float32

EXACT = "float32"  # the dtype models are loaded in for measuring, and switched back to
QUANTIZED = quantized.QUANTIZED  # q4: float32 weights, the linears served from their codes
QUANTIZED_A8 = quantized.QUANTIZED_A8  # q4a8: the same codes against 8-bit activations
QUANTIZED_MODES = tuple(quantized.ACTIVATION_BITS)


def torch_dtype(name: str) -> torch.dtype:
    """The dtype a candidate's weights and activations are held in (the quantized modes': float32)."""
    return torch.float32 if name in QUANTIZED_MODES else DTYPES[name]


def quantizable(target: LoadedModel) -> bool:
    """Whether q4 is a candidate for `target`: on a CPU, from a GGUF file (whose linears may hold a
    quantized type's codes; a check finds out), with the q4 kernel built (never built here)."""
    from ..decoding import kernels

    return target.device.type == "cpu" and target.converted_copies is not None and kernels.built()


def codes_copy(target: LoadedModel) -> Path | None:
    """Where q4's codes of `target` are stored: beside its GGUF cache entry's converted weights."""
    return target.converted_copies / quantized.COPY_NAME if target.converted_copies is not None else None


class NotExact(RuntimeError):
    """q4 of weights whose codes could not all be recovered from their floats: partly a fresh
    quantization, which `auto` does not choose."""


def convert(target: LoadedModel, name: str) -> None:
    """`target`'s weights in dtype `name` from now on (in place: loaded once; a GGUF's converted copy
    read where one is stored, models.convert_weights; q4: the linears on their codes, stored there too)."""
    if name in QUANTIZED_MODES:
        convert(target, EXACT)
        quantized.quantize_target(target, name)
        return
    if DTYPES[name] != target.dtype:
        convert_weights(target, DTYPES[name])
        target.dtype = DTYPES[name]


class Weights:
    """The model's parameters in each dtype tried, switched in place by `use(name)` (one model,
    one converted copy of its weights per dtype, made on first use); float32 again on exit."""

    def __init__(self, model: torch.nn.Module, codes: Path | None = None) -> None:
        self.model, self.codes = model, codes  # codes: where q4's are stored (quantized.install's copy)
        self.served: dict | None = None  # q4's forwards by layer, once built
        self.exact = False  # q4's codes are a file's own
        self.parameters = [(name, p) for name, p in model.named_parameters() if p.is_floating_point()]
        self.copies: dict[str, list[torch.Tensor]] = {EXACT: [p.data for _, p in self.parameters]}
        self.current = EXACT

    def use(self, name: str) -> None:
        if name == self.current:
            return
        if self.current in QUANTIZED_MODES:
            quantized.remove(self.model)
            self.current = EXACT
        if name in QUANTIZED_MODES:  # the float32 weights, with the linears served from their codes
            self.use(EXACT)
            if self.served is None:  # built once (a switch is timed with the steps it precedes)
                done = quantized.install(self.model, self.codes)
                self.served = {layer: layer.__dict__["forward"] for layer in self.model.modules()
                               if isinstance(layer.__dict__.get("forward"), quantized.QuantizedLinear)}
                self.exact = done.quantized > 0 and done.exact == done.quantized
            for layer, forward in self.served.items():
                layer.forward = forward
            quantized.use_activations(self.model, name)
            self.current = name
            if not self.exact:
                raise NotExact(f"the codes of some of its linears could not be recovered from their de-quantized floats "
                               f"({name} would quantize those groups afresh)")
            return
        if name not in self.copies:
            dtype, kept = DTYPES[name], kept_in_float32(self.model, DTYPES[name])
            with torch.no_grad():
                self.copies[name] = [data if kept(label) else data.to(dtype)
                                     for (label, _), data in zip(self.parameters, self.copies[EXACT])]
        for (_, parameter), data in zip(self.parameters, self.copies[name]):
            parameter.data = data
        self.current = name

    def __enter__(self) -> "Weights":
        return self

    def __exit__(self, *exc: object) -> None:
        self.use(EXACT)
        self.copies, self.served = {EXACT: self.copies[EXACT]}, None
