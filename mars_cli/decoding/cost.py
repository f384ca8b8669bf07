"""A measured cost model: what one target forward costs by its width, and the draft length
that buys the most tokens per second with it.

Speculative decoding pays only when a verification pass over k + 1 positions costs little more
than a pass over one, and how much more depends on the device, the dtype and the kernels: on this
project's CPU in float32 a width of 3 costs more than a width of 5, in bfloat16 widths up to 8 are
free. So the curve is measured, not assumed: once per (device, dtype, model, compile mode,
threads, torch version), then cached as JSON in the user cache. A cache file that does not parse
or does not match its key is measured again, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from ..paths import cache_dir, write_atomic
from .tree import CHAIN, DraftTree, TreeShape

if TYPE_CHECKING:
    from .target import TargetScorer

SCHEMA = 3  # 3: widths 1..17, 25, 33, 49, 65 (draft trees)
DEFAULT_WIDTHS = (*range(1, 18), 25, 33, 49, 65)
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
                           "ms_by_width": {str(w): ms for w, ms in sorted(self.ms_by_width.items())}}, indent=1)


MAX_TREE_TOKENS = 64
TREE_DEPTH = 6  # `--num-draft auto` with a tree: the most levels searched
TREE_DEPTHS = (3, 4, 5, 6)  # the depths auto chooses from (or none); each level is one drafter step
TREE_SIZES = (8, 16, 24, 32, 48, 64)  # a curve measures widths 9, 17, 25, 33, 49 and 65
TREE_COST_RATIO = 1.2  # a tree may make the verification forward this much dearer than a plain step
TREE_TOPK = 4


def tree_shape(curve: CostCurve) -> TreeShape:
    """`--draft-topk auto` / `--draft-tokens auto`: the widest tree whose verification forward
    costs at most TREE_COST_RATIO times a plain step on this device and dtype (measured), with
    TREE_TOPK children per node; a chain where even 8 nodes cost more (float32 on a CPU, where
    width is dear). Only measured widths count (a compiled curve has 1, 5 and 17). The ratio and
    sizes come from the tree benchmarks in docs/benchmarks.md: on this project's CPU in bfloat16,
    16 nodes (1.18x a plain step's cost there) were as fast as 8 or faster, 32 slower: acceptance
    grows slowly past 16 nodes while the forward's cost keeps rising."""
    plain = curve.cost(1)
    measured = [n for n in TREE_SIZES if n + 1 in curve.ms_by_width]  # never an extrapolated width
    affordable = [n for n in measured if curve.ms_by_width[n + 1] <= TREE_COST_RATIO * plain]
    if not affordable:
        return CHAIN
    return TreeShape(TREE_TOPK, max(affordable))


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


def best_draft_length(curve: CostCurve, acceptance: Sequence[float], draft_ms: float | Callable[[int], float],
                      max_k: int, min_k: int = 1, lengths: Sequence[int] | None = None,
                      width: Callable[[int], int] | None = None) -> int:
    """The k in [min_k, max_k] (and in `lengths`, when given) with the most expected tokens per
    millisecond: a round costs one forward of width k + 1 (or `width(k)`: a tree's is fixed) plus
    its drafting, `draft_ms(k)` or k steps of `draft_ms` each. k = 0, plain decoding (one forward
    of width 1, no drafting), is allowed when min_k is 0."""
    def drafting(k: int) -> float:
        return draft_ms(k) if callable(draft_ms) else k * draft_ms

    def rate(k: int) -> float:
        fed = 1 if k == 0 else (k + 1 if width is None else width(k))
        return expected_tokens(acceptance, k) / (curve.cost(fed) + (drafting(k) if k else 0.0))

    candidates = [k for k in range(min_k, max_k + 1) if lengths is None or k == 0 or k in lengths] or [min_k]
    return max(candidates, key=lambda k: (rate(k), -k))


# --------------------------------------------------------------------------- measuring
def curve_key(model_fingerprint: str, device: torch.device, dtype: torch.dtype, compiled: bool,
              context: int) -> dict:
    """Everything the cost depends on that can change between runs on one machine."""
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    return {
        "model": model_fingerprint,
        "device": f"{device.type}:{device_name}",
        "dtype": str(dtype).replace("torch.", ""),
        "compiled": compiled,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "context": context,
    }


def _cpu_name() -> str:
    """The CPU's model name (Linux), else what the platform module reports."""
    import platform

    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def cache_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "costs" / f"{digest}.json"


def load_cached(key: dict) -> CostCurve | None:
    """The cached curve for `key`, or None when absent, unreadable, stale or malformed."""
    path = cache_path(key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != SCHEMA or data.get("key") != key:
            return None
        costs = {int(w): float(ms) for w, ms in data["ms_by_width"].items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if not costs or any(w < 1 or not math.isfinite(ms) or ms <= 0 for w, ms in costs.items()):
        return None
    return CostCurve(key, costs)


def save(curve: CostCurve) -> Path:
    path = cache_path(curve.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, curve.to_json())
    return path


def time_widths(run_width: Callable[[int], None], widths: Sequence[int], repeats: int,
                synchronize: Callable[[], None] = lambda: None) -> dict[int, float]:
    """Median milliseconds of `run_width(w)` for each width, widths interleaved within each
    repeat (drift on a shared machine then spreads over all widths alike), after one warm-up."""
    for width in widths:
        run_width(width)
    samples: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(repeats):
        for width in widths:
            synchronize()
            start = time.perf_counter()
            run_width(width)
            synchronize()
            samples[width].append((time.perf_counter() - start) * 1000)
    return {w: statistics.median(values) for w, values in samples.items()}



def measure_curve(scorer: "TargetScorer", key: dict, widths: Sequence[int] = DEFAULT_WIDTHS, repeats: int = 5,
                  context: int = CONTEXT_TOKENS) -> CostCurve:
    """Time one forward of each width through `scorer` (so a static or compiled scorer is timed
    as it decodes) after `context` cached tokens of a fixed pseudo-text; widths interleaved."""
    target = scorer.target
    vocab = target.vocab_size
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (context + max(widths),), generator=generator)
    scorer.start(tokens[:context])
    pending = tokens[context : context + 1]

    def run_width(width: int) -> None:
        scorer.score(pending, DraftTree.chain(tokens[context + 1 : context + width]), width=width)
        scorer.rewind(context)

    device = target.device
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        costs = time_widths(run_width, widths, repeats, synchronize)
    return CostCurve(key, costs)


def curve_for(scorer: "TargetScorer", fresh: bool = False, note: Callable[[str], None] | None = None) -> CostCurve:
    """The cached curve for this scorer's model, device, dtype and compile mode; measured (and
    cached) when there is none, when the file is stale or corrupt, or when `fresh`."""
    target = scorer.target
    key = curve_key(target.fingerprint, target.device, target.dtype, scorer.compiled, CONTEXT_TOKENS)
    curve = None if fresh else load_cached(key)
    if curve is None:
        if note is not None:
            note("measuring the target's forward cost by width (once per model, device and dtype; cached)")
        curve = measure_curve(scorer, key, COMPILED_WIDTHS if scorer.compiled else DEFAULT_WIDTHS)
        save(curve)
    return curve


class AdaptiveDraftLength:
    """`--num-draft auto`: before each round, the draft length with the most expected tokens
    per second, from the cost curve and this drafter's acceptance by position as measured so far
    (with a weak prior, so early rounds still explore longer drafts).

    The choice includes 0, not drafting at all, where drafting costs more than it brings (a dear
    drafter against a cheap captured forward on a GPU, or one the target rarely agrees with). A
    round that does not draft teaches nothing, so while 0 wins every `PROBE_EVERY`-th round still
    drafts, at the best positive length, to keep the acceptance and drafting cost current.
    `lengths`, when given, are the only draft lengths allowed (a compiled scorer has a graph for
    a few widths only); 0 is always allowed."""

    PRIOR_RATE = 0.6
    PRIOR_WEIGHT = 2.0
    PROBE_EVERY = 16

    def __init__(self, curve: CostCurve, max_k: int, lengths: Sequence[int] | None = None,
                 width: Callable[[int], int] | None = None) -> None:
        self.curve = curve
        self.width = width  # the forward's width for k drafts, when not k + 1 (a tree's)
        self.max_k = max_k
        self.lengths = None if lengths is None else sorted({0, *lengths})
        self.examined = [0] * max_k  # rounds whose draft position i was looked at
        self.accepted = [0] * max_k  # ... and accepted
        self.time_by_k: dict[int, list[float]] = {}  # k -> [seconds drafting, rounds]
        self.rounds_without_draft = 0

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
        pairs whatever k is) plus a part per token, fitted by least squares over the lengths seen;
        with one length seen, proportional to k. Charging the fixed part per token instead would
        make long drafts look dearer than they are, and the chooser would shorten them for good."""
        points = [(length, seconds / count, count) for length, (seconds, count) in self.time_by_k.items()]
        if not points:
            return 0.0
        if len(points) == 1:
            length, seconds, _ = points[0]
            return 1000 * seconds * k / length
        total = sum(w for _, _, w in points)
        mean_k = sum(x * w for x, _, w in points) / total
        mean_t = sum(t * w for _, t, w in points) / total
        spread = sum(w * (x - mean_k) ** 2 for x, _, w in points)
        per_token = max(0.0, sum(w * (x - mean_k) * (t - mean_t) for x, t, w in points) / spread)
        fixed = max(0.0, mean_t - per_token * mean_k)
        return 1000 * (fixed + per_token * k)

    def choose(self, room: int) -> int:
        """The draft length for the next round, at most `room` (0: plain decoding this round)."""
        if room < 1:
            return 0
        top = min(room, self.max_k)
        cost = self.draft_cost_ms
        best = best_draft_length(self.curve, self.acceptance(), cost, top, 0, self.lengths, self.width)
        if best == 0:
            self.rounds_without_draft += 1
            if self.rounds_without_draft % self.PROBE_EVERY == 0:  # probe: keep measuring the drafter
                return best_draft_length(self.curve, self.acceptance(), cost, top, 1, self.lengths, self.width)
        return best

    def observe(self, drafted: int, accepted: int, draft_s: float | None, timed_as: int | None = None) -> None:
        """One round's outcome: `drafted` proposed (a tree's depth), the first `accepted` of them
        stood. `draft_s` None: the round's drafting time says nothing about drafting (the first
        round of a sequence, when a head reads the whole prompt's features). `timed_as`: the
        length the time belongs to, when not `drafted` (a tree searched k levels, whatever depth
        its best nodes reached)."""
        for position in range(min(drafted, accepted + 1, self.max_k)):
            self.examined[position] += 1
            if position < accepted:
                self.accepted[position] += 1
        length = drafted if timed_as is None else timed_as
        if length and draft_s is not None:
            entry = self.time_by_k.setdefault(length, [0.0, 0])
            entry[0] += draft_s
            entry[1] += 1
