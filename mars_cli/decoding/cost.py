"""A measured cost model: what one target forward costs by its width, and the draft length
that buys the most tokens per second with it.

Speculative decoding pays only when a verification pass over k + 1 positions costs little more
than a pass over one, and how much more depends on the device, the dtype and the kernels: on this
project's CPU in float32 a width of 3 costs more than a width of 5, in bfloat16 widths up to 8 are
free. So the curve is measured, not assumed: once per (device, dtype, model, compile mode,
threads, torch version), then cached as JSON in the user cache. A cache file that does not parse
or does not match its key, and any cost in it no forward could have, is measured again, never
trusted. A first use measures only the widths its session reads, by one process at a time, in
about 10 s at most (`curve_for`); a cache that cannot be written costs a note, not the run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import statistics
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

import torch

from .. import notes
from ..paths import cache_dir, write_atomic
from .acceptance import EARLY_HEAD, DraftAcceptance
from .tree import CHAIN, DraftTree, TreeShape

if TYPE_CHECKING:
    from .target import TargetScorer

T = TypeVar("T")
SCHEMA = 3  # 3: widths 1..17, 25, 33, 49, 65 (draft trees); any subset of them (a first use's)
DEFAULT_WIDTHS = (*range(1, 18), 25, 33, 49, 65)  # what `mars profile --widths` measures
# A first use measures only the widths its session reads (curve_for's callers in session.py), and
# for at most about this long (10 s; the measuring once took over 200 s on this project's 2-core
# CPU under load): a curve cut short keeps what it measured, and later uses measure the rest.
FIRST_USE_BUDGET_S = 10.0
FIRST_USE_REPEATS = 3
FRESH_REPEATS = 5
LOCK_WAIT_S = 30.0  # a second process waits this long for the first's curve, then uses a default
LOCK_POLL_S = 0.1
# a cached cost outside these is nonsense, measured again (`plausible`)
MIN_PLAUSIBLE_MS, MAX_PLAUSIBLE_MS = 1e-3, 60_000.0
MIN_WIDTH_RATIO, MAX_WIDTH_RATIO = 0.1, 1000.0
MAX_PLAUSIBLE_WIDTH = 4096
# A compiled scorer has one graph per width, each a compile (about 30 s cold on a GPU, 45 s on this
# project's CPU): with `--num-draft auto` a chain drafts this many tokens or none (widths 1 and 5),
# and the curve also measures a 16-node tree's width, the one tree size `auto` may pick there.
COMPILED_DRAFT = 4
COMPILED_TREE_TOKENS = 16
COMPILED_WIDTHS = (1, COMPILED_DRAFT + 1, COMPILED_TREE_TOKENS + 1)
CONTEXT_TOKENS = 200  # cached tokens before the timed forwards (a typical prompt + some output)


@dataclass(frozen=True)
class CostCurve:
    """Milliseconds per target forward by width (positions fed), after `context` cached tokens."""

    key: dict
    ms_by_width: dict[int, float]
    settled: frozenset[int] = frozenset()  # widths timed again, together, for a close chain-or-tree call

    def cost(self, width: int) -> float:
        """The measured cost at `width`; between measured widths the next wider one (a forward
        is never assumed cheaper than a narrower measured one would suggest), and past the
        widest a linear extrapolation from the last two."""
        widths = sorted(self.ms_by_width)
        if width in self.ms_by_width:
            return self.ms_by_width[width]
        wider = [w for w in widths if w > width]
        if wider:
            return self.ms_by_width[wider[0]]
        if len(widths) == 1:
            return self.ms_by_width[widths[0]] * width / widths[0]
        a, b = widths[-2], widths[-1]
        slope = max(0.0, (self.ms_by_width[b] - self.ms_by_width[a]) / (b - a))
        return self.ms_by_width[b] + slope * (width - b)

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, "key": self.key,
                           "ms_by_width": {str(w): ms for w, ms in sorted(self.ms_by_width.items())},
                           "settled": sorted(self.settled)}, indent=1)


MAX_TREE_TOKENS = 64
TREE_DEPTH = 6  # `--num-draft auto` with a tree: the most levels searched
TREE_DEPTHS = (3, 4, 5, 6)  # the depths auto chooses from (or none); each level is one drafter step
TREE_SIZES = (8, 16, 24, 32, 48, 64)  # a curve measures widths 9, 17, 25, 33, 49 and 65
SHAPE_WIDTHS = (1, *(n + 1 for n in TREE_SIZES))  # all that `tree_shape` reads
TREE_TOPK = 4
def tree_shape(curve: CostCurve, acceptance: DraftAcceptance = EARLY_HEAD) -> TreeShape:
    """`--draft-topk auto` / `--draft-tokens auto`: the tree whose verification forward costs the
    fewest milliseconds per expected token (its measured width's cost over the drafter's tau at
    that size), or a chain where the best chain of up to ESTIMATE_MAX_DRAFT drafts costs fewer
    (float32 on a CPU, where width is dear). Only measured widths count (a compiled curve has 1, 5
    and 17). A fixed cap on the tree's cost relative to a plain step (1.2x, until 2026-12-01) turned
    on noise: on the Intel Xeon with AMX a 9-wide forward measured 1.204x and the default drafted
    chains at 1.34x plain instead of trees at 1.68x; stale acceptance figures (an early head's, until
    2026-12-02) had an AMD EPYC draft chains at 1.64x plain where 4 x 8 trees ran at 1.80x."""
    return shape_verdict(curve, acceptance).shape


@dataclass(frozen=True)
class ShapeVerdict:
    """`tree_shape`'s answer with what decided it: `closeness`, |tree / chain - 1| of their
    milliseconds per token (inf when only one was possible), and `deciding`, the widths whose
    costs made the call (width 1, the best chain's and the best tree's)."""

    shape: TreeShape
    closeness: float
    deciding: tuple[int, ...]


def shape_verdict(curve: CostCurve, acceptance: DraftAcceptance = EARLY_HEAD) -> ShapeVerdict:
    """See `tree_shape`."""
    trees = {n: curve.ms_by_width[n + 1] / acceptance.tree(n)  # ms per token; never an extrapolated width
             for n in TREE_SIZES if n + 1 in curve.ms_by_width}
    if not trees:
        return ShapeVerdict(CHAIN, math.inf, ())
    size = min(trees, key=trees.get)
    chain_ms, k = _best_chain(curve, acceptance)
    shape = TreeShape(TREE_TOPK, size) if trees[size] < chain_ms else CHAIN
    if k == 0:  # no chain width measured: nothing to weigh the tree against
        return ShapeVerdict(shape, math.inf, ())
    return ShapeVerdict(shape, abs(trees[size] / chain_ms - 1), tuple(sorted({1, k + 1, size + 1})))


# A chain-or-tree verdict closer than this (in milliseconds per token) is timed again before it
# stands: forwards on a shared 2-core VM vary by about 15% one to the next, and on an AMD EPYC with
# AVX512-BF16 eight curves of 5 forwards a width put a 9-wide forward at 1.05-1.33x a plain one,
# while real decoding's tree won by 3-12% (docs/benchmarks.md).
SHAPE_CLOSE = 0.15
SETTLE_REPEATS = 8  # forwards of each deciding width, interleaved, when a call is close


def settle(scorer: "TargetScorer", curve: CostCurve, widths: Sequence[int], budget: "Budget",
           note: Callable[[str], None] | None = None) -> CostCurve:
    """`curve` with `widths` timed again together, SETTLE_REPEATS each within `budget` (a first use
    stays bounded), their medians replacing the old ones, marked settled and cached (unless the
    machine is busy, or the budget ran out before every width was timed fully: a later run
    settles them then). Nothing is measured when the budget is spent."""
    if budget.seconds <= 0:
        return curve
    if note is not None:
        note(f"the chain-or-tree choice is a close call on the measured costs; timing widths {_spans(widths)} "
             f"again (once; at most {budget.seconds:.0f} s)")
    busy = busy_reason()
    started = _now()
    with torch.inference_mode():
        samples = _time_width_samples(scorer, widths, SETTLE_REPEATS, _now() + budget.seconds)
    budget.seconds -= _now() - started
    full = all(len(samples.get(w, ())) >= SETTLE_REPEATS for w in widths)
    timed = {w: statistics.median(values) for w, values in samples.items() if values}
    settled = curve.settled | frozenset(widths) if full else curve.settled
    refreshed = CostCurve(curve.key, {**curve.ms_by_width, **timed}, settled)
    if busy is None and full:
        _save_or_note(refreshed)
    return refreshed


# `--dtype auto` for a session that drafts (mars_cli/dtype_choice.py) compares dtypes by what a round
# of the best shape each one affords would cost per token: chains up to ESTIMATE_MAX_DRAFT, or the
# tree `tree_shape` picks, at the default drafter's figures (acceptance.py).
ESTIMATE_MAX_DRAFT = 4
ESTIMATE_WIDTHS = tuple(sorted({*range(1, ESTIMATE_MAX_DRAFT + 2), *SHAPE_WIDTHS}))


def _best_chain(curve: CostCurve, acceptance: DraftAcceptance, min_k: int = 1) -> tuple[float, int]:
    """(milliseconds of target forwards per emitted token, k) for the best chain of min_k up to
    ESTIMATE_MAX_DRAFT drafts at measured widths (k = 0: plain decoding; positions past the
    figures' last are accepted at its rate); a plain step's cost when no chain width was measured."""
    measured = [k for k in range(1, ESTIMATE_MAX_DRAFT + 1) if k + 1 in curve.ms_by_width]
    if not measured and min_k > 0:
        return curve.cost(1), 0
    k = best_draft_length(curve, acceptance.chain, 0.0, ESTIMATE_MAX_DRAFT, min_k=min_k, lengths=measured)
    return curve.cost(k + 1) / expected_tokens(acceptance.chain, k), k


def speculative_estimate(curve: CostCurve, acceptance: DraftAcceptance = EARLY_HEAD) -> tuple[float, str]:
    """(milliseconds of target forwards per emitted token, the shape) for the cheapest of: plain
    decoding, a chain of 1..ESTIMATE_MAX_DRAFT, and the tree `tree_shape` picks from this curve,
    at the drafter's figures. Drafting's own cost is left out: it is about the same in every dtype,
    and what differs between dtypes is what the target's width costs. Only measured widths count."""
    ms, k = _best_chain(curve, acceptance, min_k=0)
    options = [(ms, f"a chain of {k}" if k else "plain decoding")]
    shape = tree_shape(curve, acceptance)
    if shape.branches:
        options.append((curve.ms_by_width[shape.tokens + 1] / acceptance.tree(shape.tokens),
                        f"a {shape.topk} x {shape.tokens} tree"))
    return min(options)


def shape_widths(compiled: bool) -> tuple[int, ...]:
    """The widths `tree_shape` reads: a compiled scorer's one tree width, or every tree size's."""
    return (1, COMPILED_TREE_TOKENS + 1) if compiled else SHAPE_WIDTHS


def chain_widths(max_draft: int, compiled: bool) -> tuple[int, ...]:
    """The widths a chain of at most `max_draft` tokens verifies (a compiled scorer: its one)."""
    return (1, COMPILED_DRAFT + 1) if compiled else tuple(range(1, max_draft + 2))


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """Tokens one round emits on average with k drafts, given the chance that each draft
    position is accepted when all before it were (`acceptance[i]` for position i; positions past
    the list reuse its last value): 1 + a0 + a0*a1 + ... (the bonus or correction always comes)."""
    total, reach = 1.0, 1.0
    for position in range(k):
        rate = acceptance[min(position, len(acceptance) - 1)] if acceptance else 0.0
        reach *= min(max(rate, 0.0), 1.0)
        total += reach
    return total


def best_draft_length(curve: CostCurve | LiveCosts, acceptance: Sequence[float], draft_ms: float | Callable[[int], float],
                      max_k: int, min_k: int = 1, lengths: Sequence[int] | None = None,
                      width: Callable[[int], int] | None = None, propose_rate: float = 1.0,
                      miss_ms: float = 0.0) -> int:
    """The k in [min_k, max_k] (and in `lengths`, when given) with the most expected tokens per
    millisecond: a round costs one forward of width k + 1 (or `width(k)`: a tree's is fixed) plus
    its drafting, `draft_ms(k)` or k steps of `draft_ms` each. k = 0, plain decoding (one forward
    of width 1, no drafting), is allowed when min_k is 0. A drafter asked for a draft proposes
    one with probability `propose_rate`; otherwise (an n-gram with no match, a head below its
    confidence gate) the round is a plain step that also paid `miss_ms` for asking."""
    def drafting(k: int) -> float:
        return draft_ms(k) if callable(draft_ms) else k * draft_ms

    def rate(k: int) -> float:
        if k == 0:
            return 1.0 / curve.cost(1)
        fed = k + 1 if width is None else width(k)
        p = min(max(propose_rate, 0.0), 1.0)
        tokens = p * expected_tokens(acceptance, k) + (1 - p)
        return tokens / (p * (curve.cost(fed) + drafting(k)) + (1 - p) * (curve.cost(1) + miss_ms))

    candidates = [k for k in range(min_k, max_k + 1) if lengths is None or k == 0 or k in lengths] or [min_k]
    return max(candidates, key=lambda k: (rate(k), -k))


# --------------------------------------------------------------------------- measuring
def machine_key(model_fingerprint: str, device: torch.device) -> dict:
    """What any measurement of a model's speed depends on that can change between runs on one
    machine: the model, the device (the CPU's or GPU's name, and a CPU's matrix instruction sets:
    two CPUs sold under one name, "Intel(R) Xeon(R) Processor" say, may differ in AMX or AVX-512),
    the threads and the torch version. Cost curves (`curve_key`) and dtype choices
    (mars_cli/dtype_choice.py) add their own."""
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = " ".join([_cpu_name(), *_cpu_matrix_flags()])
    return {
        "model": model_fingerprint,
        "device": f"{device.type}:{device_name}",
        "kernels": _cpu_kernels() if device.type == "cpu" else "",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


# environment variables that cap the instruction set oneDNN's kernels use (its old and new names)
ONEDNN_ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def _cpu_kernels() -> str:
    """The instruction set the CPU kernels actually run with, which is not always what the CPU
    lists: `ATEN_CPU_CAPABILITY=avx2` makes torch's own kernels AVX2 ones, and
    `ONEDNN_MAX_CPU_ISA=AVX2` keeps oneDNN's matrix products off AVX-512 and AMX. A measurement
    taken under such a cap must not serve a run without it, nor the reverse."""
    caps = [f"{name}={os.environ[name]}" for name in ONEDNN_ISA_VARIABLES if os.environ.get(name)]
    return " ".join([torch.backends.cpu.get_cpu_capability(), *caps])


# the CPU features a matrix kernel's speed turns on (x86 and Arm names, as /proc/cpuinfo lists them)
MATRIX_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                "amx_int8", "asimd", "sve", "sve2", "bf16", "i8mm", "sme")


@functools.cache
def _cpuinfo() -> tuple[str, ...]:
    """/proc/cpuinfo's lines, read once per process (Linux; elsewhere none)."""
    info = Path("/proc/cpuinfo")
    return tuple(info.read_text().splitlines()) if info.is_file() else ()


def _cpu_matrix_flags() -> list[str]:
    """Which of MATRIX_FLAGS this CPU lists (Linux; elsewhere none are known)."""
    for line in _cpuinfo():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            present = set(value.split())
            return [flag for flag in MATRIX_FLAGS if flag in present]
    return []


LOAD_HEADROOM = 0.5  # load average above usable cores + this before measuring: the machine is busy


def busy_reason() -> str | None:
    """Why a speed measurement taken now would not be representative, or None: a load average
    above the cores this process may use plus LOAD_HEADROOM (another job would share every
    step). Such measurements serve the run that made them and are never cached."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # not on this platform
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    if load > cores + LOAD_HEADROOM:
        return f"load average {load:.1f} on {cores} cores: a busy machine"
    return None


def curve_key(model_fingerprint: str, device: torch.device, dtype: torch.dtype, compiled: bool,
              context: int, packed: bool = False) -> dict:
    """Everything the cost depends on that can change between runs on one machine (`packed`: the
    linears run on prepacked weights, mars_cli/packing.py)."""
    return {
        **machine_key(model_fingerprint, device),
        "dtype": str(dtype).replace("torch.", ""),
        "compiled": compiled,
        "context": context,
        "packed": packed,
    }


def _cpu_name() -> str:
    """The CPU's model name (Linux), else what the platform module reports."""
    import platform

    names = [line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def cache_path(key: dict, folder: str = "costs") -> Path:
    """The cache entry for `key`: `<cache>/<folder>/<hash of the key>.json`."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / folder / f"{digest}.json"


def read_entry(path: Path, schema: int, key: dict) -> dict | None:
    """A cached measurement's JSON object when it parses, has this `schema` and was measured for
    `key`; None when absent, unreadable (a directory, a plain file where a folder belongs),
    malformed or stale. The caller checks the fields it reads (any exception listed here, raised
    while it does, means the same)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("schema") != schema or data.get("key") != key:
            return None
    except (OSError, ValueError, TypeError, RecursionError):
        return None
    return data


ENTRY_ERRORS = (ValueError, TypeError, KeyError, AttributeError, RecursionError)  # a malformed entry's fields


def machine_facts() -> dict:
    """The CPU, its matrix instruction sets, the threads and torch: what a benchmark's figures are
    printed and stored beside (never carried from one machine to another)."""
    return {"cpu": _cpu_name(), "flags": _cpu_matrix_flags(), "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def plausible_times(*times: object) -> bool:
    """Whether every time a cached choice records (a dtype's, packing's, the int8 head's) is a number
    a real measurement could give: not a bool, between MIN_PLAUSIBLE_MS and MAX_PLAUSIBLE_MS."""
    return all(isinstance(ms, (int, float)) and not isinstance(ms, bool) and MIN_PLAUSIBLE_MS <= ms <= MAX_PLAUSIBLE_MS
               for ms in times)


def announced(line: str, unsaved: str | None, scope: str) -> str:
    """A measured choice's note: `line`, then that it was cached (measured once per `scope`) or,
    with `unsaved` (why not), that it serves this run only."""
    if unsaved is None:
        return f"{line}; measured once per {scope}"
    return f"{line}; for this run only ({unsaved}), measured again next time"


def plausible(ms_by_width: dict[int, float]) -> dict[int, float]:
    """The widths whose cost could be a real forward's: a hand-edited or corrupted file may hold
    well-formed nonsense (every width 1e-9 ms, or 1e9 ms), and a curve trusted as it is decides
    every round's draft length. Kept: between 1 microsecond and 60 s, and a wider forward between
    a tenth of and 1000 times width 1's (nothing is kept without a plausible width 1). The rest
    is measured again."""
    plain = ms_by_width.get(1)
    if plain is None or not MIN_PLAUSIBLE_MS <= plain <= MAX_PLAUSIBLE_MS:
        return {}
    return {w: ms for w, ms in ms_by_width.items()
            if 1 <= w <= MAX_PLAUSIBLE_WIDTH and MIN_PLAUSIBLE_MS <= ms <= MAX_PLAUSIBLE_MS
            and MIN_WIDTH_RATIO <= ms / plain <= MAX_WIDTH_RATIO}


def load_cached(key: dict) -> CostCurve | None:
    """The cached curve for `key` (its plausible widths only), or None when absent, unreadable
    (a directory, a plain file where `costs/` belongs), stale or malformed."""
    data = read_entry(cache_path(key), SCHEMA, key)
    if data is None:
        return None
    try:
        costs = {int(w): float(ms) for w, ms in data["ms_by_width"].items()}
    except ENTRY_ERRORS:
        return None
    costs = plausible({w: ms for w, ms in costs.items() if math.isfinite(ms)})
    settled = data.get("settled", [])
    settled = frozenset(w for w in settled if type(w) is int and w in costs) if isinstance(settled, list) else frozenset()
    return CostCurve(key, costs, settled) if costs else None


def write_entry(path: Path, text: str) -> Path:
    """Write a cache entry atomically; OSError when the cache cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    return path


def save(curve: CostCurve) -> Path:
    """Write the curve to its cache entry; OSError when the cache cannot be written."""
    return write_entry(cache_path(curve.key), curve.to_json())


def save_or_note(path: Path, text: str, what: str) -> bool:
    """Cache a measurement where the cache can be written; elsewhere (an entry that is a
    directory, a read-only or immutable folder, a plain file in its place) go on without it, and
    say so once: a cache is an optimisation, never a reason to stop after the measuring is done.
    Returns whether it was written."""
    try:
        write_entry(path, text)
        return True
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        notes.note(f"cannot cache the {what} at {path} ({reason}); decoding without caching it (the next run "
                   "measures it again)", once=True)
        return False


def _save_or_note(curve: CostCurve) -> None:
    """Cache the curve where the cache can be written (`save_or_note`)."""
    save_or_note(cache_path(curve.key), curve.to_json(), "cost curve")


def _now() -> float:
    """The measuring clock (one name, so a test can drive it)."""
    return time.perf_counter()


def time_interleaved(run: Callable[[T], None], items: Sequence[T], repeats: int,
                     synchronize: Callable[[], None] = lambda: None, deadline: float | None = None,
                     prepare: Callable[[T], None] = lambda item: None) -> dict[T, list[float]]:
    """Milliseconds of each call `run(item)`, `repeats` of them per item: each item warmed up once
    just before its first timing, then items interleaved within each further repeat (A B A B:
    drift on a shared machine then spreads over all items alike). With a `deadline` (on
    `_now()`), stop once it has passed and keep what was timed: the first item is always timed
    (once, unwarmed, when the deadline has passed already), items not reached are left out, and
    the items reached keep the repeats they got. `prepare(item)` runs before each call, untimed
    (the int8 head's measurement evicts the head's weights there, as a round's target pass does)."""
    samples: dict[T, list[float]] = {}

    def timed(item: T) -> None:
        prepare(item)
        synchronize()
        start = _now()
        run(item)
        synchronize()
        samples.setdefault(item, []).append((_now() - start) * 1000)

    def out_of_time() -> bool:
        return deadline is not None and bool(samples) and _now() >= deadline

    for item in items:
        if out_of_time():
            break
        if deadline is None or _now() < deadline:  # (a prefill that spent the budget warmed up the first)
            prepare(item)
            run(item)  # warm-up: an item's first call pays for allocation
        timed(item)
    reached = list(samples)
    for _ in range(repeats - 1):
        for item in reached:
            if out_of_time():
                break
            timed(item)
    return samples


# A verdict whose measured ratio lies this close to its line (packed against dense, bfloat16 against
# float32) is timed once more before it is trusted, the blocks pooled: on the Intel Xeon with AMX one
# packing measurement read 1.00 of dense where three taken minutes later read 0.76 to 0.92.
CLOSE_CALL = 0.05


def close_call(ratio: float, line: float) -> bool:
    """Whether `ratio` (a candidate's time over the reference's) is within CLOSE_CALL of `line`."""
    return abs(ratio - line) <= CLOSE_CALL


def pooled(first: dict[T, list[float]], second: dict[T, list[float]]) -> dict[T, list[float]]:
    """Two `time_interleaved` results as one: each item's blocks from both."""
    return {item: first.get(item, []) + second.get(item, []) for item in {**first, **second}}


def time_widths(run_width: Callable[[int], None], widths: Sequence[int], repeats: int,
                synchronize: Callable[[], None] = lambda: None, deadline: float | None = None) -> dict[int, float]:
    """Median milliseconds of `run_width(w)` for each width, timed by `time_interleaved` (widths
    not reached by the `deadline` are left out: a later use measures them)."""
    samples = time_interleaved(run_width, widths, repeats, synchronize, deadline)
    return {w: statistics.median(values) for w, values in samples.items()}


def measure_curve(scorer: "TargetScorer", key: dict, widths: Sequence[int] = DEFAULT_WIDTHS, repeats: int = 5,
                  context: int = CONTEXT_TOKENS, budget_s: float | None = None) -> CostCurve:
    """Time one forward of each width through `scorer` (so a static or compiled scorer is timed
    as it decodes) after `context` cached tokens of a fixed pseudo-text; widths interleaved.
    `budget_s`: stop after about that many seconds (the prefill included), keeping what was
    measured (see `time_widths`); the curve may then lack some widths."""
    deadline = None if budget_s is None else _now() + budget_s
    with torch.inference_mode():
        samples = _time_width_samples(scorer, widths, repeats, deadline, context)
    return CostCurve(key, {w: statistics.median(values) for w, values in samples.items()})


def _time_width_samples(scorer: "TargetScorer", widths: Sequence[int], repeats: int, deadline: float | None,
                        context: int = CONTEXT_TOKENS) -> dict[int, list[float]]:
    """Each width's forwards through `scorer` in milliseconds, after `context` cached tokens of a
    fixed pseudo-text, widths interleaved (`time_interleaved`)."""
    target = scorer.target
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, target.vocab_size, (context + max(widths),), generator=generator)
    pending = tokens[context : context + 1]

    def run_width(width: int) -> None:
        scorer.score(pending, DraftTree.chain(tokens[context + 1 : context + width]), width=width)
        scorer.rewind(context)

    device = target.device
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    scorer.start(tokens[:context])
    return time_interleaved(run_width, widths, repeats, synchronize, deadline)


@dataclass
class Budget:
    """Seconds of measuring a session may still spend on its curve, over all its calls to
    `curve_for` (the tree shape's widths, then the chain's): a first use stays bounded."""

    seconds: float = FIRST_USE_BUDGET_S


def default_curve(key: dict, plain_ms: float) -> CostCurve:
    """A stand-in curve, never cached, for a session that waited too long for another process's
    measurement: each extra position costs 10% of a plain forward of `plain_ms` (what float32
    costs on this project's CPU, about), so chains of a few tokens and no trees."""
    return CostCurve(key, {w: plain_ms * (1 + 0.1 * (w - 1)) for w in range(1, MAX_TREE_TOKENS + 2)})


class EntryLock:
    """An exclusive flock on `<entry>.lock` beside a cache entry, so that one process at a time
    measures it (two measuring at once each time the other's load, and both would cache it: a
    cost curve, a dtype choice), polled until `wait_s` has passed. Kept after use (unlinking a lock file races with its
    next user); the kernel drops it when its holder dies. Where no lock file can be made (no
    fcntl, an unwritable cache) there is nothing to share either: `acquired` is then True."""

    def __init__(self, entry: Path, wait_s: float, waiting: Callable[[], None]) -> None:
        self.path = entry.with_name(entry.name + ".lock")
        self.wait_s, self.waiting = wait_s, waiting
        self.handle = None
        self.acquired = False

    def __enter__(self) -> "EntryLock":
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on POSIX
            self.acquired = True
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = open(self.path, "a+b")
        except OSError:
            self.acquired = True
            return self
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.acquired = True
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return self
            if self.waiting is not None:
                self.waiting()
                self.waiting = None
            time.sleep(LOCK_POLL_S)

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.close()  # closing releases the lock


M = TypeVar("M")


def cached_or_measured(path: Path, read: Callable[[], M | None], measure: Callable[[], M],
                       held: Callable[[str], M], what: str, fresh: bool = False,
                       waiting: Callable[[], None] | None = None) -> M:
    """A measurement cached at `path` (a dtype choice, a packing choice): `read()` unless `fresh`,
    else `measure()`d under the entry's lock (read again once it is had: another process may have
    measured it meanwhile) and saved as its `to_json()` unless its `unsaved` says why not (set when
    the cache cannot be written). A lock still held after LOCK_WAIT_S gives `held(reason)`."""
    if not fresh:
        cached = read()
        if cached is not None:
            return cached
    with EntryLock(path, LOCK_WAIT_S, waiting) as lock:
        if not lock.acquired:
            return held(f"another mars process was still measuring after {LOCK_WAIT_S:.0f} s")
        cached = None if fresh else read()
        if cached is not None:
            return cached
        result = measure()
        if result.unsaved is None and not save_or_note(path, result.to_json(), what):  # type: ignore[attr-defined]
            result.unsaved = "the cache cannot be written"  # type: ignore[attr-defined]
    return result


def _spans(widths: Sequence[int]) -> str:
    """1, 2, 3, 5, 9 -> "1-3, 5, 9"."""
    runs: list[list[int]] = []
    for width in sorted(widths):
        if runs and width == runs[-1][-1] + 1:
            runs[-1].append(width)
        else:
            runs.append([width])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def curve_for(scorer: "TargetScorer", widths: Sequence[int] | None = None, *, fresh: bool = False,
              note: Callable[[str], None] | None = None, known: CostCurve | None = None,
              budget: Budget | None = None) -> CostCurve:
    """The curve for this scorer's model, device, dtype and compile mode, with at least `widths`
    (default: every width `mars profile --widths` shows, or a compiled scorer's few): what
    `known` (this session's curve so far) and the cache hold, the widths missing measured under
    the entry's lock within `budget` (a first use stays bounded: about FIRST_USE_BUDGET_S) and
    cached. A process that finds the lock held waits for the other's result and reads it; after
    LOCK_WAIT_S it decodes with `default_curve`, uncached. `fresh` measures every width afresh,
    unbounded (`mars profile --widths`); so is a compiled scorer's measuring (its few widths)."""
    target = scorer.target
    from ..packing import installed

    key = curve_key(target.fingerprint, target.device, target.dtype, scorer.compiled, CONTEXT_TOKENS,
                    installed(target.model))
    wanted = sorted(set(widths or (COMPILED_WIDTHS if scorer.compiled else DEFAULT_WIDTHS)) | {1})
    have: dict[int, float] = {}
    settled: frozenset[int] = frozenset()  # kept through: a settled width is not timed again
    if not fresh:
        have = {**(known.ms_by_width if known is not None else {})}
        settled = known.settled if known is not None else settled
        if all(w in have for w in wanted):
            return CostCurve(key, have, settled)
        cached = load_cached(key)
        have = {**(cached.ms_by_width if cached else {}), **have}
        settled = settled | (cached.settled if cached else frozenset())
        if all(w in have for w in wanted):
            return CostCurve(key, have, settled)
    waiting = (lambda: note(f"another mars process is measuring this cost curve; waiting for it "
                            f"(at most {LOCK_WAIT_S:.0f} s)")) if note is not None else None
    with EntryLock(cache_path(key), LOCK_WAIT_S, waiting) as lock:
        if not lock.acquired:
            if not fresh:
                return _stand_in(scorer, key, have)
        elif not fresh:  # measured by another process while this one waited?
            cached = load_cached(key)
            have = {**(cached.ms_by_width if cached else {}), **have}
            settled = settled | (cached.settled if cached else frozenset())
        missing = [w for w in wanted if w not in have]
        if not missing:
            return CostCurve(key, have, settled)
        # a compiled scorer's widths are few, and each one's first forward is a compile that decoding
        # would pay anyway: no budget (one cut short would leave its chain width unmeasured for good)
        budget = Budget(math.inf) if fresh or scorer.compiled else (budget or Budget())
        if budget.seconds <= 0 and 1 in have:
            return CostCurve(key, have, settled)
        if note is not None:
            limit = "" if math.isinf(budget.seconds) else f", at most {max(budget.seconds, 0):.0f} s"
            note(f"measuring the target's forward cost at widths {_spans(missing)} (once per model, device and "
                 f"dtype{limit}; cached)")
        busy = busy_reason()  # before measuring: the measuring itself loads the machine
        started = _now()
        measured = measure_curve(scorer, key, missing, FRESH_REPEATS if fresh else FIRST_USE_REPEATS,
                                 budget_s=None if math.isinf(budget.seconds) else budget.seconds)
        budget.seconds -= _now() - started
        curve = CostCurve(key, {**have, **measured.ms_by_width}, settled)
        if busy is None:
            _save_or_note(curve)
        elif note is not None:
            note(f"the cost curve measured now is for this run only ({busy}); measured again next time")
    return curve


def _stand_in(scorer: "TargetScorer", key: dict, have: dict[int, float]) -> CostCurve:
    """The lock's wait ran out: a default curve scaled by width 1's cost (known, or one forward
    timed now), with whatever this process already knows on top; not cached."""
    plain = have.get(1)
    if plain is None:
        plain = measure_curve(scorer, key, (1,), repeats=1).ms_by_width[1]
    notes.note(f"another mars process has been measuring this cost curve for {LOCK_WAIT_S:.0f} s; decoding "
               "with a default curve this time (not cached)", once=True)
    return CostCurve(key, {**default_curve(key, plain).ms_by_width, **have})


class LiveCosts:
    """What a target forward of each width costs in this session, as its rounds time it: the
    median of a width's timings in the last STALE rounds once LIVE_MIN of them were; before that
    the cached curve's figure, scaled by how the machine runs now against the curve. The curve was
    measured once, maybe while the machine was busier or quieter, or on another CPU of the same
    name; a round's own time is what the choice must stand on (`cost` reads like CostCurve's).

    Every figure the chooser compares must be of the same moment: a machine that slows down 2x
    while only tree rounds run (drafting on) must not see them against plain rounds timed before,
    or against the curve's quiet figure, or it switches drafting off for the wrong reason (on the
    Intel Xeon with AMX three of eight chat prompts drafted nothing that way). So a width not
    timed in the last STALE rounds is moved with the machine: by how much the width timed now
    moved since (when it was timed then too), else by the curve's ratio to it (`cost`)."""

    LIVE_MIN = 3
    LIVE_KEEP = 64
    STALE = 32  # timed rounds after which a width's own median is no longer of this moment

    def __init__(self, curve: CostCurve) -> None:
        self.curve = curve
        self.timed: dict[int, deque[float]] = {}
        self.when: dict[int, deque[int]] = {}  # the round count at each of `timed`'s entries
        self.rounds = 0  # timed rounds so far
        self.latest: int | None = None  # the width timed last
        self._medians: dict[int, float | None] = {}  # read many times a round: worked out once per change
        self._windows: dict[tuple[int, int], float | None] = {}  # (width, round) -> `_recent`, until the next timing

    def observe(self, width: int, ms: float) -> None:
        """One round's target forward of `width` took `ms`."""
        self.rounds += 1
        self.timed.setdefault(width, deque(maxlen=self.LIVE_KEEP)).append(ms)
        self.when.setdefault(width, deque(maxlen=self.LIVE_KEEP)).append(self.rounds)
        self.latest = width
        self._medians.pop(width, None)
        self._windows.clear()

    def live(self, width: int) -> float | None:
        """The session's own median for `width`, once LIVE_MIN rounds of it were timed."""
        if width not in self._medians:
            samples = self.timed.get(width)
            enough = samples is not None and len(samples) >= self.LIVE_MIN
            self._medians[width] = statistics.median(samples) if enough else None
        return self._medians[width]

    def cost(self, width: int) -> float:
        """`width`'s median over the last STALE rounds when it was timed LIVE_MIN times in them;
        else moved to this moment by the width timed last: its older median times how much that
        width moved since (when it was timed then too), or the curve's figure times that width's
        recent cost over the curve's for it. Before anything was timed recently, as before."""
        recent = self._recent(width, self.rounds)
        if recent is not None:
            return recent
        now = self.latest
        reference = None if now is None else self._recent(now, self.rounds)
        live = self.live(width)
        if reference is None:
            return live if live is not None else self.curve.cost(width)
        if live is not None:
            then = self._recent(now, self.when[width][-1])
            if then is not None:
                return live * reference / then
        return self.curve.cost(width) * reference / self.curve.cost(now)

    def _recent(self, width: int, round_: int) -> float | None:
        """The median of `width`'s timings in the STALE rounds up to round `round_`, when it was
        timed at least LIVE_MIN times in them."""
        key = (width, round_)
        if key not in self._windows:
            samples = self.timed.get(width, ())
            near = [ms for ms, at in zip(samples, self.when.get(width, ())) if round_ - self.STALE < at <= round_]
            self._windows[key] = statistics.median(near) if len(near) >= self.LIVE_MIN else None
        return self._windows[key]


class AdaptiveDraftLength:
    """`--num-draft auto`: before each round, the draft length with the most expected tokens
    per second, from the cost curve and this drafter's acceptance by position as measured so far
    (with a weak prior, so early rounds still explore longer drafts).

    The choice includes 0, not drafting at all, where drafting costs more than it brings (a dear
    drafter against a cheap captured forward on a GPU, or one the target rarely agrees with). A
    round that does not draft teaches nothing, so while 0 wins a round now and then still drafts
    (a probe, at the best positive length) to keep the acceptance and drafting cost current: after
    PROBE_EVERY plain rounds, or more where a probe is dear, so that probing costs at most
    PROBE_SHARE of the decoding time (`probe_interval`). A probe is decided one round ahead, and
    foreseen FEATURE_LEAD rounds ahead (`keep_features`): only the plain rounds just before it hand
    a draft head the target's features.
    Forward costs come from `LiveCosts`: the rounds' own timings, the cached curve until then.
    `lengths`, when given, are the only draft lengths allowed (a compiled scorer has a graph for
    a few widths only); 0 is always allowed.

    Drafting times are read robustly (`typical_draft_s`): one round slowed by the machine (another
    process, a page fault) early in a sequence must not make drafting look dear for good. With a
    plain mean of one or two rounds it did: the probe interval, scaled by that cost, then kept
    drafting off for a whole run (3 drafting rounds of 1,251 on an AMD EPYC, 0.95x plain). So
    until DRAFT_TIMED rounds of drafting were timed, probes come every PROBE_EVERY plain rounds."""

    PRIOR_RATE = 0.6
    PRIOR_WEIGHT = 2.0
    PROBE_EVERY = 16  # plain rounds between probes, at least
    PROBE_SHARE = 0.005  # what probing may cost, as a share of decoding time, while drafting is off
    FEATURE_LEAD = 8  # plain rounds before a probe that hand the drafter features (docs/head.md)
    DRAFT_TIMED = 3  # drafting timings of a length before their median is taken (the least until then)
    DRAFT_KEEP = 32  # the recent drafting timings kept per length

    def __init__(self, curve: CostCurve, max_k: int, lengths: Sequence[int] | None = None,
                 width: Callable[[int], int] | None = None) -> None:
        self.curve = curve
        self.costs = LiveCosts(curve)
        self.width = width  # the forward's width for k drafts, when not k + 1 (a tree's)
        self.max_k = max_k
        self.lengths = None if lengths is None else sorted({0, *lengths})
        self.examined = [0] * max_k  # rounds whose draft position i was looked at
        self.accepted = [0] * max_k  # ... and accepted
        self.time_by_k: dict[int, list[float]] = {}  # k -> [seconds drafting, rounds]
        self.recent_draft_s: dict[int, deque[float]] = {}  # k -> the last DRAFT_KEEP rounds' drafting seconds
        self._typical: dict[int, float] = {}  # read many times a round: worked out once per timing
        self.rounds_without_draft = 0
        self.proposed_rounds = 0  # rounds asked for a draft that got one
        self.empty_rounds = 0  # ... that got none
        self.empty_s: list[float] = []  # what asking cost in those (timed ones)
        self.probe_next = False  # decided by a plain round: the next round drafts
        self.probe_soon = False  # ... a probe comes within FEATURE_LEAD rounds
        self.drafting = True  # the last choice was a draft (or could not be made): the next may be one

    @property
    def drafted(self) -> int:
        """Draft positions whose drafting time was measured."""
        return int(sum(k * count for k, (_, count) in self.time_by_k.items()))

    @property
    def draft_s(self) -> float:
        return sum(seconds for seconds, _ in self.time_by_k.values())

    def acceptance(self) -> list[float]:
        """P(draft position i accepted | all before it were), smoothed towards the prior."""
        return [(a + self.PRIOR_RATE * self.PRIOR_WEIGHT) / (e + self.PRIOR_WEIGHT)
                for a, e in zip(self.accepted, self.examined)]

    def draft_cost_ms(self, k: int) -> float:
        """Measured drafting time of a k-token round: a fixed part (a head reads the round's true
        pairs whatever k is) plus a part per token, fitted by least squares over the lengths timed
        DRAFT_TIMED times; with one such length, proportional to k; with none yet, at the least
        cost per token seen (one stalled round at a length must not price that length out before
        it is timed again). Charging the fixed part per token would make long drafts look dearer
        than they are, and the chooser would shorten them for good."""
        points = [(length, self.typical_draft_s(length), count) for length, (_, count) in self.time_by_k.items()]
        known = [point for point in points if len(self.recent_draft_s[point[0]]) >= self.DRAFT_TIMED]
        if not points:
            return 0.0
        if len(known) < 2:
            return 1000 * k * min(seconds / length for length, seconds, _ in known or points)
        total = sum(w for _, _, w in known)
        mean_k = sum(x * w for x, _, w in known) / total
        mean_t = sum(t * w for _, t, w in known) / total
        spread = sum(w * (x - mean_k) ** 2 for x, _, w in known)
        per_token = max(0.0, sum(w * (x - mean_k) * (t - mean_t) for x, t, w in known) / spread)
        fixed = max(0.0, mean_t - per_token * mean_k)
        return 1000 * (fixed + per_token * k)

    def typical_draft_s(self, k: int) -> float:
        """What drafting k tokens takes, in seconds: the median of the recent rounds once
        DRAFT_TIMED were timed; before that the least of them, since a timing is only ever
        lengthened by interference, never shortened."""
        if k not in self._typical:
            samples = self.recent_draft_s[k]
            self._typical[k] = statistics.median(samples) if len(samples) >= self.DRAFT_TIMED else min(samples)
        return self._typical[k]

    def propose_rate(self) -> float:
        """P(the drafter proposes something | asked), smoothed towards proposing."""
        asked = self.proposed_rounds + self.empty_rounds
        return (self.proposed_rounds + self.PRIOR_WEIGHT) / (asked + self.PRIOR_WEIGHT)

    def miss_ms(self) -> float:
        """What asking cost in a round that got no draft (median of those timed)."""
        return 1000 * statistics.median(self.empty_s) if self.empty_s else 0.0

    def choose(self, room: int) -> int:
        """The draft length for the next round, at most `room` (0: plain decoding this round)."""
        if room < 1:
            self.drafting = True  # the sequence ends here: nothing to save for
            return 0
        top = min(room, self.max_k)
        best = best_draft_length(self.costs, self.acceptance(), min_k=0, **self._model(top))
        if best == 0 and self.probe_next:  # decided last round, which kept the features a head needs
            self.probe_next, self.probe_soon, self.rounds_without_draft = False, False, 0
            best = best_draft_length(self.costs, self.acceptance(), min_k=1, **self._model(top))
        elif best == 0:
            self.rounds_without_draft += 1
            plain, lead = self.rounds_without_draft, self.FEATURE_LEAD - 1
            if plain + lead >= self.PROBE_EVERY:  # a probe may be near: when is it due (never before PROBE_EVERY)?
                probe = best_draft_length(self.costs, self.acceptance(), min_k=1, **self._model(self.max_k))
                interval = self.probe_interval(probe)
                self.probe_next, self.probe_soon = plain >= interval, plain + lead >= interval
            else:
                self.probe_next = self.probe_soon = False
        else:
            self.probe_next, self.probe_soon, self.rounds_without_draft = False, False, 0
        self.drafting = best > 0
        return best

    def defer(self) -> None:
        """The round just chosen to draft cannot (its drafter lacks the last plain round's
        features: the live costs turned the choice between two rounds): it runs plain and keeps
        the features, and the next round drafts, as a probe if nothing else."""
        self.probe_next, self.drafting = True, False

    def keep_features(self) -> bool:
        """Whether the round just chosen should hand the drafter the target's features: when the
        next round may draft, and in the FEATURE_LEAD plain rounds before a probe (a head drafts
        better having read the recent pairs: docs/head.md). False while drafting is off and no
        probe is near, so those plain rounds cost a plain step."""
        return self.drafting or self.probe_next or self.probe_soon

    def _model(self, top: int) -> dict:
        return dict(draft_ms=self.draft_cost_ms, max_k=top, lengths=self.lengths, width=self.width,
                    propose_rate=self.propose_rate(), miss_ms=self.miss_ms())

    def probe_interval(self, k: int) -> int:
        """Plain rounds between probes of length k: at least PROBE_EVERY, and as many as keep the
        probes' extra cost over a plain step within PROBE_SHARE of the time spent decoding; every
        PROBE_EVERY while only one or two drafting rounds were timed (their cost is a guess)."""
        if 0 < sum(count for _, count in self.time_by_k.values()) < self.DRAFT_TIMED:
            return self.PROBE_EVERY
        fed = k + 1 if self.width is None else self.width(k)
        plain = self.costs.cost(1)
        extra = self.costs.cost(fed) + self.draft_cost_ms(k) - plain
        return max(self.PROBE_EVERY, math.ceil(extra / (self.PROBE_SHARE * plain)))

    def observe(self, drafted: int, accepted: int, draft_s: float | None, timed_as: int | None = None,
                asked: int = 0, width: int | None = None, target_s: float | None = None) -> None:
        """One round's outcome: `drafted` proposed (a tree's depth), the first `accepted` of them
        stood. `draft_s` None: the round's drafting time says nothing about drafting (the first
        round of a sequence, when a head reads the whole prompt's features). `timed_as`: the
        length the time belongs to, when not `drafted` (a tree searched k levels, whatever depth
        its best nodes reached). `asked`: the length the round asked for. A drafter that was asked
        but proposed nothing (an n-gram without a match, a head below its confidence gate) made
        the round a plain step that also paid for asking: such rounds teach how often it proposes
        and what a miss costs (`propose_rate`, `miss_ms`), so a dear drafter that rarely dares
        stops being asked, while a free one that often misses (n-gram) keeps being asked.
        `width`, `target_s`: the target forward's width this round and what it took (`LiveCosts`)."""
        if width is not None and target_s is not None and target_s > 0:
            self.costs.observe(width, 1000 * target_s)
        if asked and not drafted:  # asked, proposed nothing: how often, and what asking cost
            self.empty_rounds += 1
            if draft_s is not None:
                self.empty_s.append(draft_s)
            return
        if drafted:
            self.proposed_rounds += 1
        for position in range(min(drafted, accepted + 1, self.max_k)):
            self.examined[position] += 1
            if position < accepted:
                self.accepted[position] += 1
        length = drafted if timed_as is None else timed_as
        if length and draft_s is not None:
            entry = self.time_by_k.setdefault(length, [0.0, 0])
            entry[0] += draft_s
            entry[1] += 1
            self.recent_draft_s.setdefault(length, deque(maxlen=self.DRAFT_KEEP)).append(draft_s)
            self._typical.pop(length, None)
