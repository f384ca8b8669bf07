"""Linear layers on a GGUF's own codes (`--dtype q4`), multiplied in float32.

A GGUF's quantized weights reach us dequantised (models/gguf_cache.py): every group of 32 inputs
of a row holds `offset + scale * q` for integer codes q (Q4_0/Q4_1/Q4_K: 16 levels; Q5_*, Q6_K,
Q8_0: up to 256). Where the GGUF file is at hand, `install` reads them from its blocks
(models/gguf_codes.py: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, each checked equal to the loaded
weight); for the other layers (Q6_K, IQ4_NL...) `recover` finds them again from the float32 values; a group
whose codes the search does not find (weights from no quantized file: every group) is quantized
afresh at its layer's width (Q4_1's rule: 16 levels, or 256 where the recovered groups need them;
a draft head's, 256), which loses precision, and `QuantizedLinear.exact` and `.failed` say so.

The product runs on this project's AVX2 kernel (decoding/kernels: 4-bit codes two a byte, 8-bit
codes one a byte) where it builds, else on torch's int4 kernel (`aten._weight_int4pack_mm_for_cpu`;
256 levels as two int4 matrices, q = 16 high + low). Both compute in float32, so an exact layer's
product equals `F.linear` on the dequantised weights to float32 rounding: `--dtype q4` of a
quantized GGUF is its float32 model, served from a fifth of the bytes (codes, scales and offsets).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..models import LoadedModel

GROUP = 32  # inputs per group: GGUF's block size, and the kernel's group size
LEVELS_INT4 = 16
LEVELS_INT8 = 256
INNER_K_TILES = 2  # the packing's tile parameter (the CPU kernel takes any of 2, 4, 8)
# an exact code reproduces its value to this fraction of the group's range, plus a few float32
# roundings of its magnitude (a group of 2.0000 to 2.0003 is stored to 2.4e-7)
EXACT_TOLERANCE = 1e-5
FLOAT32_ROUNDING = 1e-6
MAX_CODES_PER_STEP = 8  # a group's smallest step between values may span up to this many codes
COPY_FORMAT = 2  # a stored copy's layout (install's `copy`); 2: each layer's source (1's may hold searched codes)
FROM_BLOCKS, SEARCHED, FRESH = "blocks", "search", "fresh"  # where a layer's codes came from (Codes.source)
QUANTIZED = "q4"  # LoadedModel.linears for a model served from its codes, multiplied in float32
QUANTIZED_A8 = "q4a8"  # the same codes against 8-bit activations, multiplied in integers (llama.cpp's way)
ACTIVATION_BITS = {QUANTIZED: 32, QUANTIZED_A8: 8}  # the quantized modes, and their inputs' bits


@dataclass
class Codes:
    """A weight as groups of `offset + scale * code`: codes [out, in] (int32, 0..levels-1), scale and
    offset [out, in / GROUP] (float32)."""

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    levels: int  # 16 or 256
    exact: bool  # reproduces the weight (to float32 rounding), not a fresh quantization
    failed: int = 0  # groups whose codes were not recovered, quantized afresh (all of them: no search)
    source: str = SEARCHED  # read from the file's blocks, recovered by the search (some groups maybe afresh), or afresh


def recover(weight: torch.Tensor, fresh_levels: int = LEVELS_INT4, search: bool = True) -> Codes:
    """The integer codes behind `weight`'s values, group by group: exact where every group is
    `offset + scale * q` with at most 256 levels. Groups the search cannot fit are quantized
    afresh, each with its own scale and offset as every group has: to the recovered groups' width
    (at least `fresh_levels`), or, where none was recovered, to `fresh_levels` levels (16, Q4_1's
    rule; 256 for a draft head, whose precision only moves its acceptance). `search=False`:
    weights known to be floats (a head's) are quantized afresh without looking."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    spread = high - low
    if not search:
        return _fresh(groups, low, spread, fresh_levels)
    tolerance = EXACT_TOLERANCE * spread + FLOAT32_ROUNDING * torch.maximum(low.abs(), high.abs()) \
        + torch.finfo(torch.float32).tiny
    # Q4_1 and most 4-bit groups use all 16 levels (their least and greatest values are codes 0 and 15)
    fits, scale, codes = _fit(groups, low, spread, tolerance, torch.full_like(spread, LEVELS_INT4 - 1))
    if not bool(fits.all()):  # the rest, from the steps between their values
        rest = ~fits
        found = _fit_by_steps(groups[rest], low[rest], spread[rest], tolerance[rest])
        fits[rest], scale[rest], codes[rest] = found
    if bool(fits.all()):
        width = LEVELS_INT4 if int(codes.max()) < LEVELS_INT4 else LEVELS_INT8
        return Codes(codes.reshape(out_features, in_features).to(torch.int32), scale, low, width, True)
    if not bool(fits.any()):
        return _fresh(groups, low, spread, fresh_levels)
    return _patched(groups, low, spread, fits, scale, codes, fresh_levels)


def _patched(groups: torch.Tensor, low: torch.Tensor, spread: torch.Tensor, fits: torch.Tensor, scale: torch.Tensor,
             codes: torch.Tensor, fresh_levels: int) -> Codes:
    """The recovered groups' codes kept, the rest (`~fits`) quantized afresh at the layer's width:
    one awkward group of a Q6_K layer costs that group's precision, not the layer's."""
    recovered_levels = LEVELS_INT4 if int(codes[fits].max()) < LEVELS_INT4 else LEVELS_INT8
    width = max(recovered_levels, fresh_levels)
    rest = ~fits
    fresh = _fresh(groups[rest], low[rest], spread[rest], width)
    codes, scale = codes.clone(), scale.clone()
    codes[rest], scale[rest] = fresh.codes.to(codes.dtype), fresh.scale
    out_features = groups.shape[0]
    return Codes(codes.reshape(out_features, -1).to(torch.int32), scale, low, width, False, int(rest.sum()))


def _fresh(groups: torch.Tensor, low: torch.Tensor, spread: torch.Tensor, levels: int) -> Codes:
    """A fresh quantization of `groups` to `levels` levels from each group's least value (Q4_1's rule)."""
    scale = torch.where(spread > 0, spread / (levels - 1), torch.ones_like(spread))
    codes = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, levels - 1)
    return Codes(codes.reshape(groups.shape[0], -1).to(torch.int32), scale, low, levels, False, spread.numel(), FRESH)


def _fit(groups: torch.Tensor, low: torch.Tensor, spread: torch.Tensor, tolerance: torch.Tensor,
         levels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which groups are exactly `low + (spread / levels) * q` with integer q below 256, with the
    scale and codes that would be (a constant group: scale 1, codes 0)."""
    scale = torch.where((levels > 0) & (spread > 0), spread / levels.clamp_min(1), torch.ones_like(spread))
    codes = ((groups - low[..., None]) / scale[..., None]).round()
    rebuilt = low[..., None] + scale[..., None] * codes
    fits = (rebuilt - groups).abs().le(tolerance[..., None]).all(-1) & (codes.amax(-1) < LEVELS_INT8)
    return fits, scale, codes


def _fit_by_steps(groups: torch.Tensor, low: torch.Tensor, spread: torch.Tensor,
                  tolerance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_fit` with each group's levels from the smallest step between its distinct values, which is
    one code or k codes (codes 0, 2, 5: k = 2)."""
    steps = groups.sort(-1).values.diff(dim=-1)
    smallest = torch.where(steps > tolerance[..., None], steps, torch.inf).amin(-1)
    smallest = torch.where(torch.isfinite(smallest), smallest, torch.ones_like(smallest))  # one value: any grid
    fits = torch.zeros_like(spread, dtype=torch.bool)
    scale, codes = torch.ones_like(spread), torch.zeros_like(groups)
    for k in range(1, MAX_CODES_PER_STEP + 1):
        trial_fits, trial_scale, trial_codes = _fit(groups, low, spread, tolerance, (spread / smallest * k).round())
        new = trial_fits & ~fits
        scale, codes = torch.where(new, trial_scale, scale), torch.where(new[..., None], trial_codes, codes)
        fits |= new
        if bool(fits.all()):
            break
    return fits, scale, codes


@dataclass
class Int4Matrix:
    """One packed int4 matrix and its per-group scales and zeros, in the kernel's layout."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor  # [in / GROUP, out, 2]

    @classmethod
    def of(cls, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> "Int4Matrix":
        """The kernel reads a code c as (c - 8) * scale + zero: zero = offset + 8 * scale gives back
        offset + scale * c."""
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), INNER_K_TILES)
        zero = offset + 8 * scale
        return cls(packed, torch.stack([scale.t(), zero.t()], dim=-1).contiguous())

    def product(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_and_zeros.to(x.dtype))


@dataclass
class CodeMatrix:
    """The codes as this project's kernel reads them (decoding/kernels): a byte holds two 4-bit
    codes, j and j + 16 of a group (GGUF's Q4 layout), or one 8-bit code."""

    codes: torch.Tensor  # uint8 [out, in / 2] or [out, in]
    scale: torch.Tensor  # float32 [out, in / GROUP]
    offset: torch.Tensor
    bits: int
    activations: int = 32  # the inputs' bits in the product: float32, or 8 (q4a8)

    @classmethod
    def of(cls, found: Codes) -> "CodeMatrix":
        codes = found.codes.to(torch.uint8)
        bits = 4 if found.levels == LEVELS_INT4 else 8
        if bits == 4:
            halves = codes.reshape(codes.shape[0], -1, 2, GROUP // 2)
            codes = (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(codes.shape[0], -1)
        return cls(codes.contiguous(), found.scale.contiguous(), found.offset.contiguous(), bits)

    @property
    def packed(self) -> torch.Tensor:
        return self.codes

    def unpacked(self) -> torch.Tensor:
        """The codes one a byte, [out, in] in weight order."""
        if self.bits == 8:
            return self.codes
        grouped = self.codes.reshape(self.codes.shape[0], -1, GROUP // 2)  # byte j: code j low, code j + 16 high
        return torch.cat([grouped & 0x0F, grouped >> 4], dim=-1).reshape(self.codes.shape[0], -1)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight [out, in] these codes stand for: offset + scale * code, group by group."""
        return self.offset.repeat_interleave(GROUP, 1) + self.scale.repeat_interleave(GROUP, 1) * self.unpacked().float()

    def product(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.activations == 8:
            return torch.ops.mars.quantized_linear_a8(x, self.codes, self.scale, self.offset, self.bits, bias)
        return torch.ops.mars.quantized_linear(x, self.codes, self.scale, self.offset, self.bits, bias)


def backend() -> str:
    """The kernel `--dtype q4` uses here: ours where it builds and runs, else torch's."""
    from . import kernels

    return "mars" if kernels.problem() is None else "torch"


class QuantizedLinear:
    """One linear layer's forward on its codes, in place of `F.linear` on its float weight; the
    float weight stays (embeddings tied to it read it)."""

    def __init__(self, matrices: list, bias: torch.Tensor | None, exact: bool, levels: int, failed: int = 0,
                 groups: int = 0, source: str = SEARCHED) -> None:
        self.matrices, self.bias, self.exact, self.levels = matrices, bias, exact, levels
        self.failed, self.groups = failed, groups  # groups quantized afresh, of all its groups of GROUP weights
        self.source = source  # Codes.source

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None, kernel: str | None = None) -> "QuantizedLinear":
        return cls.from_codes(recover(weight), bias, kernel)

    @classmethod
    def from_codes(cls, found: Codes, bias: torch.Tensor | None, kernel: str | None = None) -> "QuantizedLinear":
        """`found`'s layer on `kernel` (ours or torch's; by default ours where it builds)."""
        kernel = kernel or backend()
        if kernel == "mars":
            from . import kernels

            why = kernels.problem()  # loads it
            if why is not None:
                raise RuntimeError(why)
            matrices: list = [CodeMatrix.of(found)]
        elif found.levels == LEVELS_INT4:
            matrices = [Int4Matrix.of(found.codes, found.scale, found.offset)]
        else:  # q = 16 * high + low: offset + scale * q = (offset + 16 scale * high) + (scale * low)
            high, low = found.codes // LEVELS_INT4, found.codes % LEVELS_INT4
            matrices = [Int4Matrix.of(high, found.scale * LEVELS_INT4, found.offset),
                        Int4Matrix.of(low, found.scale, torch.zeros_like(found.offset))]
        return cls(matrices, None if bias is None else bias.detach(), found.exact, found.levels, found.failed,
                   found.scale.numel(), found.source)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.matrices) == 1 and isinstance(self.matrices[0], CodeMatrix):  # one call: the hot path
            return self.matrices[0].product(x, self.bias)
        rows = x.reshape(-1, x.shape[-1])
        if not rows.is_contiguous():
            rows = rows.contiguous()
        out = self.matrices[0].product(rows)
        for matrix in self.matrices[1:]:
            out = out + matrix.product(rows)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


def problem(layer: torch.nn.Linear) -> str | None:
    """Why this layer cannot run on its codes (one phrase), or None."""
    if layer.weight.device.type != "cpu":
        return "q4 layers run on a CPU kernel"
    if layer.weight.dtype != torch.float32:
        return "q4 layers compute in float32"
    if layer.in_features % GROUP or layer.out_features % 16:
        return f"a {layer.out_features}x{layer.in_features} layer does not split into the kernel's tiles"
    return None


@dataclass
class Installed:
    """What `install` did to a model: layers on their codes, and those left on `F.linear`."""

    quantized: int
    exact: int  # of those, reproducing the float weights (a quantized file's codes)
    code_bytes: int
    left: dict[str, str]  # layer name -> why it stays dense
    read: bool = False  # the codes were read from a stored copy, not recovered now
    failed: int = 0  # groups (of GROUP weights) whose codes were not recovered: quantized afresh
    groups: int = 0  # all the groups of the layers that are not exact
    fresh_bits: tuple[int, ...] = ()  # the widths those groups were quantized afresh to
    sources: dict[str, int] | None = None  # layers by where their codes came from (Codes.source)


def installed_counts(forwards: list["QuantizedLinear"], left: dict[str, str], read: bool) -> Installed:
    """What `forwards` (the model's quantized layers) hold: how many, how many exactly, in how many
    bytes, and the groups that were quantized afresh."""
    inexact = [f for f in forwards if not f.exact]
    return Installed(len(forwards), len(forwards) - len(inexact),
                     sum(m.packed.numel() * m.packed.element_size() for f in forwards for m in f.matrices),
                     left, read, sum(f.failed for f in inexact), sum(f.groups for f in inexact),
                     tuple(sorted({4 if f.levels == LEVELS_INT4 else 8 for f in inexact})),
                     {source: sum(f.source == source for f in forwards) for source in (FROM_BLOCKS, SEARCHED, FRESH)})


def install(model: torch.nn.Module, copy: Path | None = None, fresh_levels: int = LEVELS_INT4,
            search: bool = True) -> Installed:
    """Run every linear of `model` that can on its codes; the rest stay. `copy`: a file of those codes
    (safetensors) in a GGUF cache entry's folder, read where it holds them all, else written, the
    codes read from the entry's GGUF file's blocks where they can be (file_codes), else recovered
    from the weights; `fresh_levels` and `search`: for weights that are no file's codes (recover)."""
    layers = {name: layer for name, layer in model.named_modules() if isinstance(layer, torch.nn.Linear)}
    left = {name: why for name, layer in layers.items() if (why := problem(layer)) is not None}
    wanted = [name for name in layers if name not in left]
    stored = read_codes(copy, wanted) if copy is not None else None
    unserved = [name for name in wanted if not isinstance(layers[name].__dict__.get("forward"), QuantizedLinear)]
    read = file_codes(model, copy, unserved) if copy is not None and stored is None and search and unserved else {}
    found: dict[str, Codes] = {}
    with torch.no_grad():
        for name in unserved:
            layer = layers[name]
            if stored is not None:
                found[name] = stored[name]
            else:
                found[name] = read.get(name) or recover(layer.weight, fresh_levels, search)
            layer.forward = QuantizedLinear.from_codes(found[name], layer.bias)
    if copy is not None and stored is None and found:
        write_codes(copy, found)
    forwards = [layers[name].__dict__["forward"] for name in wanted]
    return installed_counts(forwards, left, stored is not None)


def file_codes(model: torch.nn.Module, copy: Path, names: list[str]) -> dict[str, Codes]:
    """The codes of the linears `names` read from the blocks of the GGUF file whose cache entry holds
    `copy` (models/gguf_codes.py: each equal to its weight), where that file is still there; the
    others (other block types, another file) are left to `recover`."""
    from ..models import gguf_codes

    gguf = gguf_codes.source_gguf(copy.parent.parent)
    if gguf is None:
        return {}
    return {name: Codes(torch.from_numpy(read.codes.numpy().astype("int32")), read.scale, read.offset, read.levels,
                        True, source=FROM_BLOCKS)  # numpy's cast: torch's waited on its threads on a busy machine
            for name, read in gguf_codes.linear_codes(gguf, model, names).items()}


def read_codes(copy: Path, names: list[str]) -> dict[str, Codes] | None:
    """The codes of `names` from `copy`, or None where it is missing, unreadable, of another
    format or lacks one of them."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(copy, framework="pt") as stored:
            meta = stored.metadata() or {}
            if meta.get("format") != str(COPY_FORMAT):
                return None
            found = {}
            for name in names:
                levels = int(meta[f"levels:{name}"])
                codes = stored.get_tensor(f"{name}.codes")
                if levels == LEVELS_INT4:  # two codes a byte: j and j + 16 of a group
                    halves = torch.stack([codes & 0x0F, codes >> 4], dim=-1)
                    halves = halves.reshape(codes.shape[0], -1, GROUP // 2, 2).transpose(-1, -2)
                    codes = halves.reshape(codes.shape[0], -1)
                scale, exact = stored.get_tensor(f"{name}.scale"), meta[f"exact:{name}"] == "1"
                failed = int(meta.get(f"failed:{name}", 0 if exact else scale.numel()))  # older copies: all or none
                found[name] = Codes(codes.to(torch.int32), scale, stored.get_tensor(f"{name}.offset"), levels, exact,
                                    failed, meta.get(f"source:{name}", SEARCHED))
            return found
    except (OSError, SafetensorError, ValueError, KeyError):
        return None


def write_codes(copy: Path, found: dict[str, Codes]) -> None:
    """Store `found` whole (a temporary file, then a rename); a cache that cannot be written is skipped."""
    from safetensors.torch import save_file

    tensors, meta = {}, {"format": str(COPY_FORMAT)}
    for name, codes in found.items():
        packed = CodeMatrix.of(codes)
        tensors.update({f"{name}.codes": packed.codes, f"{name}.scale": packed.scale, f"{name}.offset": packed.offset})
        meta[f"levels:{name}"], meta[f"exact:{name}"] = str(codes.levels), "1" if codes.exact else "0"
        meta[f"failed:{name}"], meta[f"source:{name}"] = str(codes.failed), codes.source
    temporary = copy.with_name(f"{copy.name}.tmp-{os.getpid()}")
    try:
        copy.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, temporary, metadata=meta)
        os.replace(temporary, copy)
    except (OSError, RuntimeError):
        with contextlib.suppress(OSError):
            temporary.unlink()


def remove(model: torch.nn.Module) -> None:
    """Every linear of `model` back on `F.linear`."""
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), QuantizedLinear):
            del module.forward


def use_activations(model: torch.nn.Module, mode: str) -> None:
    """Every quantized linear of `model` multiplies its inputs as quantized mode `mode` does:
    float32 (q4) or 8-bit (q4a8). Only the kernel changes; the codes stay where they are."""
    bits = ACTIVATION_BITS[mode]
    for module in model.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, QuantizedLinear):
            for matrix in forward.matrices:
                if isinstance(matrix, CodeMatrix):
                    matrix.activations = bits


def installed(model: torch.nn.Module) -> bool:
    return any(isinstance(module.__dict__.get("forward"), QuantizedLinear) for module in model.modules())


def check_kernels(mode: str) -> None:
    """`--dtype mode`'s kernels, or one line: q4a8 runs on this project's only (UserError without
    them); q4 falls back to torch's int4 kernel (vectorised for AVX-512 only), and says so."""
    from ..errors import UserError
    from ..notes import note
    from . import kernels

    why = kernels.problem()  # builds them where they are missing, rebuilds a bad library once
    if why is None:
        return
    if mode == QUANTIZED_A8 or not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        raise UserError(f"--dtype {mode} needs this project's CPU kernels: {why}")
    note(f"--dtype {mode} runs on torch's int4 kernel here, not this project's: {why}", once=True)


COPY_NAME = "q4.safetensors"  # in a GGUF cache entry's folder of converted weights (models/loading.py)


def quantize_target(loaded: "LoadedModel", mode: str = QUANTIZED) -> Installed:
    """`--dtype q4` (or `q4a8`) for a loaded float32 model: its linears on their codes, read from the
    GGUF cache entry's stored copy where there is one, else from the GGUF file's blocks (seconds for
    SmolLM2-135M on 2 cores; the search in its floats took 30-60 s). Says once when the codes are new
    and where they came from, and every time when some are a fresh, lossy quantization."""
    from ..errors import UserError
    from ..notes import note

    if loaded.device.type != "cpu":
        raise UserError(f"--dtype {mode} runs on the CPU (its kernels are CPU kernels), not {loaded.device.type}: "
                        "use --device cpu, or another --dtype")
    check_kernels(mode)
    copy = loaded.converted_copies / COPY_NAME if loaded.converted_copies is not None else None
    if copy is None or not copy.is_file():
        note("preparing the q4 linears" + (" once (later loads read them)" if copy is not None else ""), once=True)
    done = install(loaded.model, copy)
    if copy is not None and not done.read and done.quantized:
        note(sources_note(mode, done), once=True)
    use_activations(loaded.model, mode)
    loaded.linears = mode
    if done.quantized == 0:
        raise UserError(f"--dtype {mode}: no linear layer of {loaded.spec} can run on codes here "
                        f"({next(iter(done.left.values()), 'none found')})")
    if done.exact < done.quantized:
        note(lossy_note(mode, done), once=True)
    return done


def sources_note(mode: str, done: Installed) -> str:
    """Where the codes just prepared came from: the GGUF file's blocks (exact, seconds), the search
    in the de-quantized floats (a type whose blocks are not read here, Q6_K...) or afresh (lossy)."""
    sources = done.sources or {}
    return (f"--dtype {mode}: the codes of {done.quantized} linear layers: {sources.get(FROM_BLOCKS, 0)} read from the "
            f"GGUF file's blocks, {sources.get(SEARCHED, 0)} recovered from their de-quantized floats, "
            f"{sources.get(FRESH, 0)} quantized afresh")


def lossy_note(mode: str, done: Installed) -> str:
    """What a partly fresh quantization says: how many groups the search could not recover codes
    for, in how many layers, and at what width they were quantized afresh (the floats may well be
    a quantized file's: the search, not the file, failed)."""
    bits = " or ".join(str(b) for b in done.fresh_bits) or "4"
    return (f"--dtype {mode}: the codes of {done.failed:,} of the {done.groups:,} groups of {GROUP} weights in "
            f"{done.quantized - done.exact} of {done.quantized} linear layers could not be recovered from their "
            f"de-quantized floats (no offset and scale with at most {LEVELS_INT8} levels reproduce those groups to "
            f"float32 rounding); those groups were quantized to {bits} bits now (lossy; the groups recovered keep "
            "their codes exactly)")
