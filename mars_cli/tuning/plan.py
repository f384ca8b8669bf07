"""What the session asks the tuning layer for: the target's dtype (before anything else is
measured on it), then its packing, the draft head's int8 rows and the cost curve, each an
instance of choice.py's protocol. What deciding cost this process (reading entries, waiting,
measuring) is clock.TALLY, start-up's tuning phase in `--stats` and `--json`; applying a choice
(converting, packing, quantizing the weights) is part of loading. What they measured is said in
one line when the session starts decoding (summary.py: `collected`, `say_tuning`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..models import LoadedModel
from . import clock, dtype, int8, packing, store, summary, threads
from .curve import FOLDER as CURVE_FOLDER
from .dtype import DtypeChoice
from .summary import collected  # noqa: F401 (the session's methods that tune: their notes make one line)


def settle_dtype(target: LoadedModel, flag: str | torch.dtype, speculative: bool = False, packed: bool = True,
                 fresh: bool = False) -> DtypeChoice | None:
    """`target` (loaded by models.load_model) in the dtype `--dtype flag` asks for: `auto`
    measured (or read) and converted to (the choice is attached as `target.dtype_choice`); an
    explicit float16 on a CPU checked, then converted; anything else as loaded. `fresh`
    (`mars tune`, `mars profile --dtypes`) measures again, whatever `flag` says."""
    if fresh or flag == "auto":  # loaded in float32, the reference
        with summary.collecting():  # said in the session's one line (eval loads its target before its sessions)
            choice = dtype.choose(target, fresh=fresh, speculative=speculative, packed=packed,
                                  budget=clock.unbounded() if fresh else None)
        target.dtype_choice = choice
        dtype.convert(target, choice.chosen if flag == "auto" else str(flag).replace("torch.", ""))
        return choice
    if flag == "float16" and target.device.type == "cpu" and target.dtype != torch.float16:
        dtype.require_usable(target, "float16", "--dtype")
    return None


def settle_packing(target: LoadedModel, mode: str, compiled: bool) -> packing.PackingChoice:
    """`--packed-weights mode` for `target` (after its dtype): packed where it pays."""
    with summary.collecting():
        return packing.settle(target, mode, compiled, timed_packed(target))


def timed_packed(target: LoadedModel) -> bool:
    """Whether `--dtype auto` chose `target`'s dtype on packed-linear timings."""
    choice = target.dtype_choice
    if choice is None or target.dtype != choice.dtype:
        return False
    return any(c.dtype == choice.chosen and c.packed for c in choice.candidates)


def entries(target: LoadedModel, packed: packing.PackingChoice, int8_head: int8.Int8Choice,
            curve_key: dict | None) -> dict[str, Path]:
    """The cache entries a session decodes by, by name (the drift check's subjects)."""
    found = {"the cost curve": store.cache_path(curve_key, CURVE_FOLDER) if curve_key else None,
             "the dtype choice": (store.cache_path(target.dtype_choice.key, dtype.FOLDER)
                                  if target.dtype_choice is not None else None),
             "the packing choice": store.cache_path(packed.key, packing.FOLDER) if packed.key else None,
             "the int8 head choice": store.cache_path(int8_head.key, int8.FOLDER) if int8_head.key else None}
    return {name: path for name, path in found.items() if path is not None}


def say_tuning() -> None:
    """The one note of what this process's sessions measured, or found provisional, when the first
    decode starts (summary.py); nothing when all was read from the cache, settled."""
    summary.flush()


def tuning_notes(target: LoadedModel, packed: packing.PackingChoice, int8_head: int8.Int8Choice,
                 curve_key: dict | None, threads_choice: threads.ThreadsChoice | None = None) -> list[str]:
    """The per-choice lines (each measured choice's own note) behind a session's one line, for
    `--json`'s `tuning.notes`: what this process measured, or found provisional, for its entries."""
    paths = list(entries(target, packed, int8_head, curve_key).values())
    if threads_choice is not None:
        paths.append(store.cache_path(threads_choice.key, threads.FOLDER))
    return summary.details(paths)
