"""The speculative decoding loop: propose -> fit -> score -> verify -> keep.

Three owners, as in vLLM's proposer / scorer / rejection sampler: the drafter proposes a draft
tree (a chain is the one-branch tree, no draft the empty one), the scorer (target.TargetScorer)
runs the target over it and owns its cache, the verifier decides which path of it stands. The loop itself keeps the budget, stopping rules and statistics. Plain decoding
is the same loop with a drafter that proposes nothing, so every speedup is measured against
exactly this code.

Invariant at the top of each round: `history` holds prompt + emitted tokens; the target cache
holds all of them but the last (`pending`), which is fed together with the drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from .controller import AdaptiveDraftLength
from .drafters import Drafter
from .sampling import PositionNoise
from .tree import DraftTree
from .stats import DecodeStats, PhaseClock
from .target import TargetScorer
from .verifiers import Verifier


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int = 128
    num_draft: int = 4
    stop_strings: tuple[str, ...] = ()
    record_margins: bool = True
    time_phases: bool = True  # per-phase laps; off only to measure their own cost
    ignore_eos: bool = False  # keep going past EOS (soak tests and fixed-length benchmarks)
    tree_tokens: int = 0  # a drafter that grows trees feeds this many nodes (padded up to it) a round
    adaptive_draft: bool = False  # the session's cost model picks each round's length (<= num_draft)


@torch.inference_mode()
def decode(
    scorer: TargetScorer,
    drafter: Drafter,
    verifier: Verifier,
    prompt_ids: Sequence[int],
    settings: DecodeSettings,
    noise: PositionNoise | None = None,
    stats: DecodeStats | None = None,
    observe: Callable[[torch.Tensor], None] | None = None,
    draft_length: AdaptiveDraftLength | None = None,
) -> Iterator[list[int]]:
    """Yield the tokens emitted by each round; fill `stats` as it goes. `observe`, if given,
    receives the target's raw logits at the positions whose tokens were emitted ([m, V]).
    `noise` fixes what sampling draws at each position (None: fresh noise); the drafter samples
    with the same (`drafter.noise`), so strict verification emits what plain sampling would.
    `draft_length`, if given, picks each round's draft length (at most `settings.num_draft`)."""
    stats = stats if stats is not None else DecodeStats()
    target = scorer.target
    prompt = torch.as_tensor(list(prompt_ids), dtype=torch.long)
    if prompt.numel() == 0:
        raise ValueError("the prompt has no tokens")
    budget = settings.max_new_tokens
    window = target.context_window
    history = torch.empty(prompt.numel() + budget, dtype=torch.long)  # CPU copy for drafters
    history[: prompt.numel()] = prompt
    length = prompt.numel()
    eos = set() if settings.ignore_eos else target.eos_token_ids
    stop_checker = _StopStrings(target.tokenizer, settings.stop_strings, length)
    stats.prompt_tokens = length

    clock = PhaseClock(target.device, settings.time_phases)
    drafter.reset()
    if noise is None and not verifier.sampling.greedy:
        noise = PositionNoise(None, target.vocab_size, target.output_device)
    drafter.noise = noise
    features = scorer.start(prompt[:-1])
    if features is not None:
        drafter.observe_features(features)
    pending = prompt[-1:].to(target.device)
    clock.lap("prefill")

    produced = 0
    no_draft = DraftTree.empty(target.device)
    reads_features = bool(scorer.feature_layers)
    features_current = True  # the drafter holds the target's features up to the cache's end
    while produced < budget:
        # k levels can emit k + 1 tokens: never draft past the budget or the context window
        room = budget - produced - 1
        if window is not None:
            room = min(room, window - length - 1)
        k = max(0, min(settings.num_draft, room))
        if draft_length is not None:
            k = draft_length.choose(k)
            if k and not features_current:  # the last plain round kept no features: this one does
                draft_length.defer()
                k = 0
        tree = drafter.propose(history[:length], k) if k else no_draft
        # a branch past k (prompt lookup's on a head tree) stays while the budget has room for it
        tree = fit(tree, max(room, 0), None if window is None else window - length - 1, scorer, settings.tree_tokens)
        draft_s = clock.lap("draft")

        # a plain round hands the drafter features only when a draft is near (the chooser knows)
        features_current = draft_length is None or draft_length.keep_features()
        scored = scorer.score(pending, tree, width=padded_width(tree, k, settings.tree_tokens),
                              features=features_current)
        target_s = clock.lap("target")

        verdict = verifier.verify(scored.logits, tree, noise, length)
        accepted = verdict.accepted_positions
        drafted = tree.tokens.tolist()
        emitted = [drafted[i] for i in accepted] + [verdict.next_token]
        clock.lap("verify")

        kept_rows = [0] + [1 + i for i in accepted]  # pending and the accepted drafts stay cached
        features = scorer.keep(kept_rows)
        if features is not None:
            drafter.observe_features(features)
        elif reads_features:
            drafter.skip_features(len(kept_rows))
        drafter.commit(length + len(accepted))
        if draft_length is not None:  # the first round reads the whole prompt: not a drafting cost
            # it learns what the k levels it chose bring; tokens past them are a bonus it does not price
            draft_length.observe(min(tree.depth, k), min(len(accepted), k), draft_s if stats.rounds else None,
                                 timed_as=tree.searched,
                                 asked=k, width=scored.width, target_s=target_s)
        clock.lap("rollback")

        emitted, reason = _cut_at_eos_or_budget(emitted, eos, budget - produced)
        emitted_tensor = torch.tensor(emitted, dtype=torch.long)
        history[length : length + len(emitted)] = emitted_tensor
        logprob = _emitted_logprob(scored.logits, kept_rows[: len(emitted)], emitted_tensor, observe)
        length += len(emitted)
        produced += len(emitted)
        pending = emitted_tensor[-1:].to(target.device)
        stats.record(verdict, tree, len(emitted), logprob, margins=settings.record_margins, width=scored.width)
        if reason is None and stop_checker.hit(history[:length]):
            reason = "stop_string"
        clock.lap("other")
        stats.end_round(clock.elapsed())
        yield emitted
        clock.exclude()  # what the caller does with a chunk (printing, say) is not decoding time
        if reason is not None or produced >= budget:
            stats.finish_reason = reason or "length"
            break
        if window is not None and length >= window:
            stats.finish_reason = "context_window"
            break
    stats.phase_s = clock.totals
    stats.wall_s = clock.elapsed()


def fit(tree: DraftTree, max_depth: int, max_nodes: int | None, scorer: TargetScorer, tree_tokens: int) -> DraftTree:
    """The tree cut to nodes at most `max_depth` deep (the round's room before the token budget)
    and, within a context window, to `max_nodes` nodes (parents stay before their children); past
    a model's sliding window, where a tree cannot be masked, its first branch as a chain."""
    tree = tree.within_depth(max_depth)
    if max_nodes is not None:
        tree = tree.first(max(max_nodes, 0))
    if not tree.is_chain() and not scorer.tree_fits(padded_width(tree, max_depth, tree_tokens)):
        tree = tree.first_branch()
    return tree


def padded_width(tree: DraftTree, depth: int, tree_tokens: int) -> int:
    """The round's fed width: a chain's k + 1, a tree's `tree_tokens` + 1 (one compiled graph
    each), or more when the drafts need it."""
    return max(depth + 1 if tree.is_chain() else tree_tokens + 1, tree.size + 1)


def _emitted_logprob(logits: torch.Tensor, rows: list[int], emitted: torch.Tensor,
                     observe: Callable[[torch.Tensor], None] | None) -> float:
    """The target's log-probability of the emitted tokens (each kept row's logits scored the
    token emitted after it); `observe` sees those logits."""
    emitted_logits = logits[torch.tensor(rows, device=logits.device)].float()
    if observe is not None:
        observe(emitted_logits)
    positions = torch.arange(len(rows), device=logits.device)
    return float(torch.log_softmax(emitted_logits, dim=-1)[positions, emitted.to(logits.device)].sum())


def _cut_at_eos_or_budget(tokens: list[int], eos: set[int], remaining: int) -> tuple[list[int], str | None]:
    """Never emit past the first EOS (kept, as transformers does) or past the token budget."""
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[: index + 1], "eos"
    return tokens[:remaining], None


class _StopStrings:
    """Detects stop strings in the generated text (decoding only a short recent tail)."""

    def __init__(self, tokenizer: object, stop_strings: tuple[str, ...], prompt_length: int) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.prompt_length = prompt_length
        self.tail_tokens = 8 + 2 * max((len(s) for s in self.stop_strings), default=0)

    def hit(self, history: torch.Tensor) -> bool:
        if not self.stop_strings:
            return False
        start = max(self.prompt_length, history.shape[0] - self.tail_tokens)
        text = self.tokenizer.decode(history[start:].tolist())
        return any(s in text for s in self.stop_strings)
