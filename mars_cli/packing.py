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
needs the product, runs `F.linear` as before. Whether packing pays is measured, never assumed
(`choose`): plain steps and tree-wide forwards, dense and packed interleaved, once per model,
device, dtype and torch, cached under `<cache>/packing/` like the dtype choice and cost curves.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from . import notes
from .decoding import cost
from .errors import KERNEL_FAILURES, UserError, first_line

MODES = ("auto", "on", "off")
SCHEMA = 1
FOLDER = "packing"  # <cache>/packing/<hash of the key>.json
# oneDNN picks its blocking for the rows it is told to expect; 25 (a default 4 x 24 tree round) was
# the best of 1, 16, 25 and 64 for widths 1 and 25 on the Intel Xeon with AMX (docs/benchmarks.md)
PACK_ROWS = 25
PACKED_DTYPES = (torch.bfloat16, torch.float32)
WIDTHS = (1, PACK_ROWS)  # what the measurement times: a plain step and a tree round
STEPS = 3  # forwards of each width per timed block
REPEATS = 5  # blocks per variant, dense and packed interleaved; the median counts
PREFERENCE = 0.97  # packed is used when its block takes at most this fraction of dense's
# a first use measures for about this long at most (8 s ran out on the AMX Xeon in a slow minute,
# 55 ms a plain step: two warm-ups with their prefills, then ten blocks)
BUDGET_S = 12.0
TOLERANCE = 1e-2  # the probe: packed and dense products agree within this (relative to the output's scale)


@dataclass
class PackingChoice:
    """Whether the target's linears run packed, and the measurement that decided it."""

    packed: bool
    problem: str | None = None  # why packing cannot be used here
    ms_dense: float | None = None  # median block: STEPS forwards at each of WIDTHS
    ms_packed: float | None = None
    key: dict = field(default_factory=dict)
    cached: bool = False
    unsaved: str | None = None  # measured now but not cached, and why
    timed_twice: bool = False  # the first blocks were a close call (cost.close_call): pooled with a second set
    follows_dtype: bool = False  # packed within noise because --dtype auto timed this dtype packed (not cached)

    def to_json(self) -> str:
        import json

        return json.dumps({"schema": SCHEMA, **asdict(self)}, indent=1)


def packable(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The linear layers packing applies to: bfloat16 and float32 weights on the CPU."""
    return [module for module in model.modules() if isinstance(module, torch.nn.Linear)
            and module.weight.device.type == "cpu" and module.weight.dtype in PACKED_DTYPES]


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
    probe = torch.randn(PACK_ROWS, layer.in_features, generator=torch.Generator().manual_seed(0)).to(layer.weight.dtype)
    try:
        with torch.inference_mode():
            packed = PackedForward(layer, PACK_ROWS)
            got, expected = packed.product(probe).float(), F.linear(probe, layer.weight, layer.bias).float()
    except KERNEL_FAILURES as exc:
        return f"torch cannot pack {dtype_name(layer.weight.dtype)} weights on this CPU ({first_line(exc)})"
    scale = float(expected.abs().max()) or 1.0
    if not torch.allclose(got, expected, rtol=0, atol=TOLERANCE * scale):
        return "the packed product differs from torch's on this CPU"
    return None


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


# --------------------------------------------------------------------------- choosing
def settle(target, mode: str, compiled: bool, timed_packed: bool = False) -> PackingChoice:
    """Pack `target`'s linears or not, for `--packed-weights mode`: `off` never; `on` wherever
    it can be done (else a UserError); `auto` when a measurement (cached) says it pays. A compiled
    scorer's forwards are left to the compiler. `timed_packed`: `--dtype auto` chose the dtype on
    packed timings; then `auto` packs unless dense was clearly faster (`follows_dtype`)."""
    if mode not in MODES:
        raise UserError(f"--packed-weights {mode}: expected auto, on or off")
    if mode == "off":
        remove(target.model)
        return PackingChoice(False, problem="--packed-weights off")
    why = "a compiled forward is left to torch.compile" if compiled else problem(target.model)
    if why is not None:
        if mode == "on":
            raise UserError(f"--packed-weights on: {why}")
        return PackingChoice(False, problem=why)
    choice = PackingChoice(True) if mode == "on" else choose(target)
    if timed_packed and mode == "auto":
        choice = follows_dtype(choice)
    if choice.packed:
        install(target.model)
    else:
        remove(target.model)
    return choice


def follows_dtype(choice: PackingChoice) -> PackingChoice:
    """A dtype chosen on packed timings runs packed unless dense's block was at most PREFERENCE of
    packed's: the dtype's measurement timed its candidates packed, and a close call between dense
    and packed (dense by default) once ran bfloat16 dense where only its packed steps had been
    timed, at 0.84-0.94x the float32 it had been chosen over (docs/benchmarks.md)."""
    if choice.packed or choice.ms_dense is None or choice.ms_packed is None:
        return choice
    if choice.ms_dense <= PREFERENCE * choice.ms_packed:
        return choice  # dense clearly faster: dense is faster still than what was timed
    notes.note(f"--packed-weights auto: {choice.key.get('dtype', 'the dtype')} packed, as --dtype auto timed it "
               f"(dense {choice.ms_dense:.0f} ms vs packed {choice.ms_packed:.0f} ms is within noise)", once=True)
    return dataclasses.replace(choice, packed=True, follows_dtype=True)


def packing_key(target) -> dict:
    """What the measurement depends on that can change between runs on one machine."""
    return {**cost.machine_key(target.fingerprint, target.device), "dtype": dtype_name(target.dtype),
            "rows": PACK_ROWS, "widths": list(WIDTHS)}


def load_cached(key: dict) -> PackingChoice | None:
    """The cached choice for `key`, or None when absent, stale or malformed (measured again)."""
    data = cost.read_entry(cost.cache_path(key, FOLDER), SCHEMA, key)
    if data is None:
        return None
    try:
        packed, dense_ms, packed_ms = data["packed"], data["ms_dense"], data["ms_packed"]
        if not isinstance(packed, bool) or not cost.plausible_times(dense_ms, packed_ms):
            return None
    except cost.ENTRY_ERRORS:
        return None
    if packed != (packed_ms <= PREFERENCE * dense_ms):
        return None
    return PackingChoice(packed, None, float(dense_ms), float(packed_ms), key, cached=True,
                         timed_twice=data.get("timed_twice") is True)


def choose(target, *, fresh: bool = False) -> PackingChoice:
    """Whether packing pays for `target` here: the cached answer, else measured (within BUDGET_S,
    under the entry's lock) and cached, with one note on stderr. `fresh` measures again, unbounded,
    silently. Packing is left installed only if chosen (the caller installs it)."""
    key = packing_key(target)
    choice = cost.cached_or_measured(
        cost.cache_path(key, FOLDER), lambda: load_cached(key),
        lambda: measure(target, key, None if fresh else cost._now() + BUDGET_S),
        lambda why: PackingChoice(False, key=key, unsaved=why),  # dense for this run, as before packing
        "packing measurement", fresh)
    if not fresh and not choice.cached:
        notes.note(describe(choice))
    return choice


def measure(target, key: dict, deadline: float | None = None) -> PackingChoice:
    """Time blocks of STEPS forwards at each of WIDTHS after cost.CONTEXT_TOKENS cached tokens,
    dense and packed interleaved (REPEATS each, and REPEATS more when the first say a close call);
    packed wins at PREFERENCE of dense or less."""
    from .decoding.kv import KVCache

    busy = cost.busy_reason()
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, target.vocab_size, (1, cost.CONTEXT_TOKENS), generator=generator)
    feeds = [torch.randint(0, target.vocab_size, (1, width), generator=generator) for width in WIDTHS]
    model = target.model
    switch = Switch(model)  # packed once: a block times forwards, not packing
    caches: dict[str, KVCache] = {}

    def run(variant: str) -> None:
        switch.set(variant == "packed")
        if variant not in caches:
            caches[variant] = KVCache(model)
            caches[variant].forward(context.to(target.device))
        for feed in feeds:
            for _ in range(STEPS):
                caches[variant].forward(feed.to(target.device))
                caches[variant].truncate(cost.CONTEXT_TOKENS)

    def medians(blocks: dict[str, list[float]]) -> tuple[float | None, float | None]:
        return tuple(statistics.median(blocks[name]) if blocks.get(name) else None for name in ("dense", "packed"))

    timed_twice = False
    try:
        with torch.inference_mode():
            blocks = cost.time_interleaved(run, ["dense", "packed"], REPEATS, deadline=deadline)
            dense, packed = medians(blocks)
            if dense and packed is not None and cost.close_call(packed / dense, PREFERENCE):
                again = None if deadline is None else cost._now() + BUDGET_S
                blocks = cost.pooled(blocks, cost.time_interleaved(run, ["dense", "packed"], REPEATS, deadline=again))
                timed_twice = True
    finally:
        remove(model)
    dense, packed = medians(blocks)
    short = [name for name in ("dense", "packed") if len(blocks.get(name) or []) < REPEATS * (1 + timed_twice)]
    unsaved = busy or (f"the measuring ran out of its {BUDGET_S:.0f} s" if short else None)
    if dense is None or packed is None:
        return PackingChoice(False, None, dense, packed, key, unsaved=unsaved or "not measured")
    return PackingChoice(packed <= PREFERENCE * dense, None, dense, packed, key, unsaved=unsaved,
                         timed_twice=timed_twice)


def describe(choice: PackingChoice) -> str:
    """The one line a measured choice is announced with."""
    verdict = "packed" if choice.packed else "left dense"
    dtype = choice.key.get("dtype", "")
    line = (f"--packed-weights auto: the target's {dtype} linears {verdict} (a plain step and a {PACK_ROWS}-wide "
            f"round, {STEPS} each: {choice.ms_dense:.0f} ms dense, {choice.ms_packed:.0f} ms packed"
            f"{', timed twice: a close call' if choice.timed_twice else ''})"
            if choice.ms_dense is not None and choice.ms_packed is not None
            else f"--packed-weights auto: the target's {dtype} linears {verdict}")
    return cost.announced(line, choice.unsaved, "model, device, dtype and torch version, then cached")
