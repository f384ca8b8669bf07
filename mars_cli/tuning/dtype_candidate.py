"""One candidate of `--dtype auto`'s measurement (tuning/dtype.py), the rule that picks among them,
and reading one back from the cache, where a field missing, mistyped or implausible makes the whole
entry be measured again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..models import DTYPES
from . import store
from .weights import EXACT, QUANTIZED_A8, QUANTIZED_MODES

# A lower precision is chosen only when its step is at most this fraction of float32's: within noise
# float32, exact, stays (the chosen dtype is then within 3% of the fastest).
EXACT_PREFERENCE = 0.97


@dataclass
class Candidate:
    """One dtype's measurement."""

    dtype: str
    usable: bool
    agreement: float | None = None  # share of the check's positions whose argmax equals float32's
    problem: str | None = None  # why it is not usable
    ms_per_step: float | None = None  # median over the timed blocks (None: not timed)
    spread: float | None = None  # slowest block over fastest
    repeats: int = 0  # timed blocks
    # speculative sessions: the target's expected milliseconds per emitted token, and in what shape
    ms_per_token: float | None = None
    shape: str | None = None
    packed: bool = False  # timed on packed linears (decoding/packing.py)
    # speculative sessions: its cost curve, each width's forward over a width-1 one ("2": 1.1, ...)
    curve: dict[str, float] | None = None


def prior(key: dict) -> str | None:
    """The candidate a measurement cut short trusts before it is timed: q4a8 where it is one (a
    GGUF's own codes on this project's kernels, the fast mode there), once it passed its check;
    None elsewhere (float32 is then the answer until something is timed faster)."""
    return QUANTIZED_A8 if QUANTIZED_A8 in key["candidates"] else None


def fastest(found: Sequence[Candidate], preferred: str | None = None) -> str:
    """The usable timed candidate with the shortest step (a speculative session: the fewest
    milliseconds per token), float32 unless another is at most EXACT_PREFERENCE of its (float32
    when nothing else was timed); `preferred` (the prior) where it passed its check but the
    measurement was cut short before timing it: an untimed q4a8 beats a timed float32 on a GGUF."""
    if preferred is not None and any(c.dtype == preferred and c.usable and c.ms_per_step is None for c in found):
        return preferred
    timed = compared(found)
    exact = timed.get(EXACT)
    best = min(timed, key=lambda name: (timed[name], name != EXACT), default=EXACT)
    if exact is not None and best != EXACT and timed[best] > EXACT_PREFERENCE * exact:
        return EXACT
    return best


def compared(found: Sequence[Candidate]) -> dict[str, float]:
    """What each usable timed candidate is compared by: its milliseconds per token where every one
    has an estimate, else its step (a step is never weighed against another's per-token estimate)."""
    timed = [c for c in found if c.usable and c.ms_per_step is not None]
    estimated = all(c.ms_per_token is not None for c in timed)
    return {c.dtype: c.ms_per_token if estimated else c.ms_per_step for c in timed}  # type: ignore[misc]


def parse_candidate(entry: dict) -> Candidate | None:
    """One cached candidate, or None when a field is missing, mistyped or implausible."""
    dtype, usable, ms = entry["dtype"], entry["usable"], entry["ms_per_step"]
    if (dtype not in DTYPES and dtype not in QUANTIZED_MODES) or not isinstance(usable, bool):
        return None
    if ms is not None and not store.plausible_times(ms):  # (a usable one cut short before its timing: None)
        return None
    problem = entry.get("problem")
    if problem is not None and not isinstance(problem, str):
        return None
    per_token, shape = store.number(entry.get("ms_per_token")), entry.get("shape")
    if per_token is not None and not store.plausible_times(per_token):
        return None
    if shape is not None and not isinstance(shape, str):
        return None
    packed = entry.get("packed", False)
    if not isinstance(packed, bool):
        return None
    relative = entry.get("curve")
    if relative is not None and not (isinstance(relative, dict) and all(
            isinstance(w, str) and w.isdigit() and store.number(r) is not None for w, r in relative.items())):
        return None
    return Candidate(dtype, usable, store.number(entry.get("agreement")), problem, store.number(ms),
                     store.number(entry.get("spread")), int(entry.get("repeats", 0)), per_token, shape, packed,
                     relative)
