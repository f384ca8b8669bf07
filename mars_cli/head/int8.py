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
float32 session stays exact. Whether int8 pays is measured, never assumed
(`choose`: drafting blocks with the head's weights evicted, full and int8 interleaved, once per
model, head shape, device and torch, cached under `<cache>/int8-head/`), as packing is
(mars_cli/packing.py). A layer whose weight changes after it was quantized (the dtype chooser
swaps weights in place) or whose product autograd needs runs its previous forward again.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from .. import notes, packing
from ..decoding import cost
from ..errors import KERNEL_FAILURES, UserError, first_line

MODES = ("auto", "on", "off")
HEAD_DTYPES = (torch.bfloat16, torch.float32)  # the heads int8 rows serve
ACTIVATIONS = torch.bfloat16  # what the int8 product multiplies them with
SCHEMA = 1
FOLDER = "int8-head"  # <cache>/int8-head/<hash of the key>.json
# the kernel reads the inputs' last dimension in vector blocks: widths that are not a multiple of 8
# crashed the process in torch 2.13 (not an exception); 32 leaves room for wider vectors
WIDTH_MULTIPLE = 32
TOLERANCE = 0.03  # the probe: int8 and full products agree within this (relative to the output's scale)
TRUE_PAIRS = 3  # a measured block: the round's true pairs read, then LEVELS tree levels of FRONTIER
LEVELS = 3
FRONTIER = 4
VARIANTS = ("full", "int8")  # the head's own weights (dense or packed), and int8 rows
REPEATS = 11  # blocks per variant, full and int8 interleaved; the median counts
PREFERENCE = 0.97  # int8 is used when its block takes at most this fraction of the full one's
BUDGET_S = 6.0  # a first use measures for about this long at most


@dataclass
class Int8Choice:
    """Whether the head's linears run on int8 weights, and the measurement that decided it."""

    used: bool
    problem: str | None = None  # why int8 cannot be used here
    ms_full: float | None = None  # median drafting block on the head's own weights
    ms_int8: float | None = None
    key: dict = field(default_factory=dict)
    cached: bool = False
    unsaved: str | None = None  # measured now but not cached, and why
    timed_twice: bool = False  # the first blocks were a close call: pooled with a second set

    def to_json(self) -> str:
        import json

        return json.dumps({"schema": SCHEMA, **asdict(self)}, indent=1)


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
    probe = torch.randn(FRONTIER, layer.in_features, generator=torch.Generator().manual_seed(0)).to(layer.weight.dtype)
    try:
        with torch.inference_mode():
            got = _Int8Forward(layer).product(probe).float()
            expected = F.linear(probe, layer.weight, layer.bias).float()
    except KERNEL_FAILURES as exc:
        return f"torch cannot multiply by int8 weights on this CPU ({first_line(exc)})"
    scale = float(expected.abs().max()) or 1.0
    if not torch.allclose(got, expected, rtol=0, atol=TOLERANCE * scale):
        return "the int8 product differs from the full-precision one on this CPU"
    return None


class _Int8Forward:
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
    fresh = [layer for layer in eligible(head) if not isinstance(layer.__dict__.get("forward"), _Int8Forward)]
    with torch.no_grad():
        for layer in fresh:
            layer.forward = _Int8Forward(layer)
    return len(fresh)


def remove(head: torch.nn.Module) -> None:
    """Every linear of `head` back on the forward it had before `install` (the int8 rows freed)."""
    for module in head.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, _Int8Forward):
            if forward.previous is None:
                del module.forward
            else:
                module.forward = forward.previous


def installed(head: torch.nn.Module) -> bool:
    """Whether any linear of `head` runs on int8 rows."""
    return any(isinstance(module.__dict__.get("forward"), _Int8Forward) for module in head.modules())


# --------------------------------------------------------------------------- choosing
def settle(head: torch.nn.Module, target, mode: str, compiled: bool = False) -> Int8Choice:
    """Put `head`'s linears on int8 rows or not, for `--int8-head mode`: `off` never; `on` wherever
    it can be done (else a UserError); `auto` when a measurement (cached) says it pays. A compiled
    drafter's steps are left to the compiler."""
    if mode not in MODES:
        raise UserError(f"--int8-head {mode}: expected auto, on or off")
    if mode == "off":
        remove(head)
        return Int8Choice(False, problem="--int8-head off")
    why = "a compiled drafter is left to torch.compile" if compiled else problem(head)
    if why is not None:
        if mode == "on":
            raise UserError(f"--int8-head on: {why}")
        return Int8Choice(False, problem=why)
    choice = Int8Choice(True) if mode == "on" else choose(head, target)
    if choice.used:
        install(head)
    else:
        remove(head)
    return choice


def int8_key(head: torch.nn.Module, target) -> dict:
    """What the measurement depends on that can change between runs on one machine: the machine,
    the target (whose pass evicts the head), the head's dtype, its linears' shapes and whether they
    were packed."""
    layers = eligible(head)
    return {**cost.machine_key(target.fingerprint, target.device),
            "dtype": str(head.fc.weight.dtype).replace("torch.", ""),
            "linears": [list(layer.weight.shape) for layer in layers],
            "packed": any(isinstance(layer.__dict__.get("forward"), packing.PackedForward) for layer in layers)}


def load_cached(key: dict) -> Int8Choice | None:
    """The cached choice for `key`, or None when absent, stale or malformed (measured again)."""
    data = cost.read_entry(cost.cache_path(key, FOLDER), SCHEMA, key)
    if data is None:
        return None
    try:
        used, full_ms, int8_ms = data["used"], data["ms_full"], data["ms_int8"]
        if not isinstance(used, bool) or not cost.plausible_times(full_ms, int8_ms):
            return None
    except cost.ENTRY_ERRORS:
        return None
    if used != (int8_ms <= PREFERENCE * full_ms):
        return None
    return Int8Choice(used, None, float(full_ms), float(int8_ms), key, cached=True,
                      timed_twice=data.get("timed_twice") is True)


def choose(head: torch.nn.Module, target, *, fresh: bool = False) -> Int8Choice:
    """Whether int8 weights pay for `head` beside `target` here: the cached answer, else measured
    (within BUDGET_S, under the entry's lock) and cached, with one note on stderr. `fresh`
    measures again, unbounded, silently. The head is left on its own weights (the caller installs)."""
    key = int8_key(head, target)
    choice = cost.cached_or_measured(
        cost.cache_path(key, FOLDER), lambda: load_cached(key),
        lambda: measure(head, target, key, None if fresh else cost._now() + BUDGET_S),
        lambda why: Int8Choice(False, key=key, unsaved=why),  # the head's own weights for this run
        "int8 head measurement", fresh)
    if not fresh and not choice.cached:
        notes.note(describe(choice))
    return choice


def measure(head: torch.nn.Module, target, key: dict, deadline: float | None = None) -> Int8Choice:
    """Time drafting blocks (TRUE_PAIRS true pairs read and scored, then LEVELS levels of FRONTIER
    pairs, each scored), each after a plain target step that evicts the head's weights as a round's
    verification does; full and int8 interleaved (REPEATS each, REPEATS more on a close call)."""
    from ..decoding.kv import KVCache
    from .parts import HeadCache

    busy = cost.busy_reason()
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, target.vocab_size, (1, cost.CONTEXT_TOKENS), generator=generator)
    step = torch.randint(0, target.vocab_size, (1, 1), generator=generator)
    dtype, device = head.fc.weight.dtype, head.fc.weight.device
    features = torch.randn(cost.CONTEXT_TOKENS, head.feature_width, generator=generator).to(device, dtype)
    tokens = context[0].to(device)
    kept = cost.CONTEXT_TOKENS - TRUE_PAIRS
    evictor = KVCache(target.model)
    head_cache = HeadCache()
    own = {layer: layer.__dict__.get("forward") for layer in eligible(head)}  # dense (None) or packed
    with torch.no_grad():
        quantized = {layer: _Int8Forward(layer) for layer in own}  # once: a block times drafting, not quantizing

    def use(variant: str) -> None:
        for layer, forward in (quantized if variant == "int8" else own).items():
            if forward is None:
                layer.__dict__.pop("forward", None)
            else:
                layer.forward = forward

    def evict(variant: str) -> None:
        """The variant's forwards in place, then a target step, untimed: the head's weights leave the caches."""
        use(variant)
        evictor.forward(step.to(target.device))
        evictor.truncate(cost.CONTEXT_TOKENS)

    def block(variant: str) -> None:
        """A round's drafting: the true pairs read and scored, then LEVELS levels of FRONTIER, each scored."""
        states = head.step(features[kept:], tokens[kept:], head_cache)
        torch.log_softmax(head.logits(states[-1:]).float(), dim=-1).topk(FRONTIER)
        fed = states[-1:].expand(FRONTIER, -1).contiguous()
        for _ in range(LEVELS):
            cached = len(head_cache)
            visible = torch.ones(FRONTIER, cached + FRONTIER, dtype=torch.bool, device=device)
            fed = head.step(fed, tokens[:FRONTIER], head_cache, torch.full((FRONTIER,), cached, device=device), visible)
            torch.log_softmax(head.logits(fed).float(), dim=-1).topk(FRONTIER)
        head_cache.truncate(kept)

    def timed(limit: float | None) -> dict[str, list[float]]:
        return cost.time_interleaved(block, VARIANTS, REPEATS, deadline=limit, prepare=evict)

    timed_twice = False
    try:
        with torch.inference_mode():
            evictor.forward(context.to(target.device))
            head.step(features[:kept], tokens[:kept], head_cache)
            blocks = timed(deadline)
            full, int8 = _medians(blocks)
            if full and int8 is not None and cost.close_call(int8 / full, PREFERENCE):
                blocks = cost.pooled(blocks, timed(None if deadline is None else cost._now() + BUDGET_S))
                timed_twice = True
    finally:
        use("full")
    full, int8 = _medians(blocks)
    short = any(len(blocks.get(v) or []) < REPEATS * (1 + timed_twice) for v in VARIANTS)
    unsaved = busy or (f"the measuring ran out of its {BUDGET_S:.0f} s" if short else None)
    if full is None or int8 is None:  # cut short before a variant was timed: the head's own weights
        return Int8Choice(False, None, full, int8, key, unsaved=unsaved or "not measured")
    return Int8Choice(int8 <= PREFERENCE * full, None, full, int8, key, unsaved=unsaved, timed_twice=timed_twice)


def _medians(blocks: dict[str, list[float]]) -> tuple[float | None, float | None]:
    """The median block of each variant (full, int8); None for a variant the budget never reached."""
    return tuple(statistics.median(blocks[v]) if blocks.get(v) else None for v in VARIANTS)  # type: ignore[return-value]


def describe(choice: Int8Choice) -> str:
    """The one line a measured choice is announced with."""
    verdict = "int8" if choice.used else "its own"
    line = (f"--int8-head auto: the draft head's linears on {verdict} weights (a round's drafting, its weights "
            f"evicted: {choice.ms_full:.1f} ms on its own, {choice.ms_int8:.1f} ms on int8"
            f"{', timed twice: a close call' if choice.timed_twice else ''})"
            if choice.ms_full is not None and choice.ms_int8 is not None
            else f"--int8-head auto: the draft head's linears on {verdict} weights")
    return cost.announced(line, choice.unsaved, "model, head, dtype, device and torch version, then cached")
