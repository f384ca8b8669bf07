"""One candidate of `--dtype auto`'s measurement (tuning/dtype.py), and reading one back from the
cache, where a field missing, mistyped or implausible makes the whole entry be measured again."""

from __future__ import annotations

from dataclasses import dataclass

from ..models import DTYPES
from . import store
from .weights import QUANTIZED_MODES


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
