"""The per-round controller behind `--num-draft auto`: before each round, the draft length with
the most expected tokens per second, from the cost curve (cost.py) moved to this moment by the
session's own timings (`LiveCosts`) and the drafter's acceptance as measured so far
(`AdaptiveDraftLength`).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Callable, Sequence

from .cost import CostCurve, best_draft_length


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
