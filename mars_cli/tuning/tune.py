"""`mars tune`: every measured choice for a target (and its draft head) on this machine, at once,
unbounded and afresh, as `llama-bench` is run once after an install.

Each step is a measured choice of this layer run `fresh` (choice.py): the dtype for drafting
sessions (with its cost curves) and for plain ones, packing in the dtype chosen, the cost curve
at every width `--num-draft auto` and the tree shape read (a close chain-or-tree call settled, as
a session would), and the int8 head. What they chose is
cached as settled entries (provisional only if the machine was busy meanwhile), so the one-liners
that follow measure nothing.
"""

from __future__ import annotations

from typing import Callable

from ..decoding import kernels
from ..decoding.acceptance import EARLY_HEAD
from ..decoding.cost import DEFAULT_WIDTHS
from ..decoding.packing import install, remove
from ..decoding.target import TargetScorer
from ..head.drafter import find_head, load_head
from ..models import LoadedModel
from . import clock, curve, dtype, int8, packing, store, threads, weights

Step = Callable[[], dict]
SETTLINGS = 4  # close chain-or-tree calls settled in a row, at most, per drafter's figures


def steps(target: LoadedModel, allow_pickle: bool = False) -> list[tuple[str, Step]]:
    """The measurements, in order, each returning its table row; `target` is loaded in float32 and
    stays so until both dtype choices are measured (every candidate is measured from float32).
    A target on llama.cpp has its own two: the thread count, then the cost curve at that count."""
    from ..llamacpp.target import LlamaTarget

    if isinstance(target, LlamaTarget):
        return llamacpp_steps(target)
    state: dict = {}

    def dtypes(speculative: bool) -> Step:
        def run() -> dict:
            choice = dtype.choose(target, fresh=True, speculative=speculative, packed=True, budget=clock.unbounded())
            if speculative:
                state["dtype"] = choice.chosen
            timed = ", ".join(f"{c.dtype} {c.ms_per_step:.1f} ms a step"
                              + (f", {c.ms_per_token:.1f} ms a token with {c.shape}" if c.ms_per_token else "")
                              for c in choice.candidates if c.ms_per_step is not None)
            if any(c.dtype in weights.QUANTIZED_MODES and c.ms_per_step is not None for c in choice.candidates):
                timed += f"; q4 and q4a8 on the kernels' {kernels.path()} path"
            return row(f"dtype ({'drafting' if speculative else 'plain'} sessions)", choice.chosen, timed,
                       choice.provenance, store.cache_path(choice.key, dtype.FOLDER))
        return run

    def packed() -> dict:
        dtype.convert(target, state["dtype"])
        if target.linears != "dense":  # q4: the linears run on their codes, never packed
            state["packed"] = False
            return row(f"packed linears ({state['dtype']})", "no", f"--dtype {target.linears} runs the linears on "
                       "their codes", None, None)
        choice = packing.choose(target, fresh=True, budget=clock.unbounded())
        state["packed"] = choice.packed
        detail = (f"dense {choice.ms_dense:.0f} ms, packed {choice.ms_packed:.0f} ms a block"
                  if choice.ms_dense is not None and choice.ms_packed is not None else choice.problem or "-")
        return row(f"packed linears ({state['dtype']})", "yes" if choice.packed else "no", detail, choice.provenance,
                   store.cache_path(choice.key, packing.FOLDER))

    def costs() -> dict:
        (install if state["packed"] else remove)(target.model)
        scorer = TargetScorer(target)
        measured = curve.curve_for(scorer, DEFAULT_WIDTHS, fresh=True)
        for figures in (dtype.default_acceptance(target.fingerprint), EARLY_HEAD):  # the head's, and other drafters'
            for _ in range(SETTLINGS):  # settled widths may turn the call to other close ones
                settled = curve.settle_close_call(scorer, measured, figures, clock.unbounded(), announce=False)
                if settled is measured:
                    break
                measured = settled
        widths = sorted(measured.ms_by_width)
        detail = ", ".join(f"{w}: {measured.ms_by_width[w] / measured.ms_by_width[1]:.2f}x" for w in widths[1::4])
        return row("cost curve (x width 1)", f"{measured.ms_by_width[1]:.1f} ms at width 1", detail, None,
                   store.cache_path(measured.key, curve.FOLDER))

    def int8_rows() -> dict:
        path = find_head(target.fingerprint)
        if path is None:
            return row("int8 head", "-", "no draft head for this target", None, None)
        if target.linears != "dense":
            return row("int8 head", "no", f"--dtype {target.linears}: the head's linears run on 8-bit codes", None, None)
        head = load_head(f"head:{path}", target, allow_pickle)
        if state["packed"]:
            install(head)
        why = int8.problem(head)
        if why is not None:
            return row("int8 head", "no", why, None, None)
        choice = int8.choose(head, target, fresh=True, budget=clock.unbounded())
        detail = f"own weights {choice.ms_full:.1f} ms, int8 {choice.ms_int8:.1f} ms a round's drafting"
        return row("int8 head", "yes" if choice.used else "no", detail, choice.provenance,
                   store.cache_path(choice.key, int8.FOLDER))

    return [("dtype for drafting sessions", dtypes(True)), ("dtype for plain sessions", dtypes(False)),
            ("packed linears", packed), ("cost curve", costs), ("int8 head", int8_rows)]


def llamacpp_steps(target) -> list[tuple[str, Step]]:
    """`--engine llama.cpp`: the thread count (threads.py), then the width curve with it."""
    from ..llamacpp.scorer import LlamaScorer

    scorer = LlamaScorer(target, target.engine)

    def thread_count() -> dict:
        choice = threads.choose(scorer, fresh=True, budget=clock.unbounded())
        scorer.set_threads(choice.threads)
        detail = ", ".join(f"{n}: {ms:.1f} ms" for n, ms in sorted(choice.ms_by_threads.items()))
        return row("thread count (llama.cpp)", str(choice.threads), f"a block of {threads.STEPS} steps with {detail}",
                   choice.provenance, store.cache_path(choice.key, threads.FOLDER))

    def costs() -> dict:
        measured = curve.curve_for(scorer, DEFAULT_WIDTHS, fresh=True)
        widths = sorted(measured.ms_by_width)
        detail = ", ".join(f"{w}: {measured.ms_by_width[w] / measured.ms_by_width[1]:.2f}x" for w in widths[1::4])
        return row("cost curve (x width 1)", f"{measured.ms_by_width[1]:.1f} ms at width 1", detail, None,
                   store.cache_path(measured.key, curve.FOLDER))

    return [("thread count", thread_count), ("cost curve", costs)]


def row(what: str, chosen: str, detail: str, provenance, entry) -> dict:
    return {"what": what, "chosen": chosen, "detail": detail, "seconds": 0.0, "entry": None if entry is None else str(entry),
            "provisional": None if provenance is None else provenance.provisional}


def run(target: LoadedModel, allow_pickle: bool = False,
        advance: Callable[[int, str], None] = lambda done, name: None) -> list[dict]:
    """Every step timed; `advance(steps done, the next one's name)` before each (a progress bar)."""
    rows = []
    for done, (name, step) in enumerate(steps(target, allow_pickle)):
        advance(done, name)
        started = clock.now()
        found = step()
        found["seconds"] = clock.now() - started
        rows.append(found)
    return rows
