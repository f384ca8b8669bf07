"""The speculative decoding loop: draft -> score -> verify -> roll back.

The loop never decides acceptance (the verifier does) and never touches a cache object
directly (kv.KVCache does). Plain decoding is the same loop with a drafter that proposes
nothing, so every speedup is measured against exactly this code.

Invariant at the top of each round: `history` holds prompt + emitted tokens; the target cache
holds all of them but the last (`pending`), which is fed together with the drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from ..models import LoadedModel
from .drafters import Drafter
from .kv import KVCache
from .stats import DecodeStats, PhaseClock
from .verifiers import Verifier


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int = 128
    num_draft: int = 4
    stop_strings: tuple[str, ...] = ()
    record_margins: bool = True
    time_phases: bool = True  # per-phase laps; off only to measure their own cost
    ignore_eos: bool = False  # keep going past EOS (soak tests and fixed-length benchmarks)
    # Feed the target k + 1 positions whenever a round has any draft, padding short drafts: a
    # forward's cost on CPU depends on its width unevenly (docs/head.md), two widths are cheaper.
    pad_drafts: bool = True


def make_generator(device: torch.device, seed: int | None) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


@torch.inference_mode()
def decode(
    target: LoadedModel,
    drafter: Drafter,
    verifier: Verifier,
    prompt_ids: Sequence[int],
    settings: DecodeSettings,
    generator: torch.Generator | None = None,
    stats: DecodeStats | None = None,
    observe: Callable[[torch.Tensor], None] | None = None,
) -> Iterator[list[int]]:
    """Yield the tokens emitted by each round; fill `stats` as it goes. `observe`, if given,
    receives the target's raw logits at the positions whose tokens were emitted ([m, V])."""
    stats = stats if stats is not None else DecodeStats()
    device = target.device
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

    clock = PhaseClock(device, settings.time_phases)
    cache = KVCache(target.model)
    drafter.reset()
    features = drafter.needs_features
    if length > 1:
        output = cache.forward(prompt[None, :-1].to(device), hidden=features)
        if features:
            drafter.observe_features(output.hidden_states[-1][0])
    pending = prompt[-1:].to(device)
    clock.lap("prefill")

    produced = 0
    while produced < budget:
        # k drafts can emit k + 1 tokens: never draft past the budget or the context window
        room = budget - produced - 1
        if window is not None:
            room = min(room, window - length - 1)
        k = max(0, min(settings.num_draft, room))
        draft = drafter.propose(history[:length], k) if k else None
        draft_tokens = draft.tokens[:k].to(device) if draft else pending[:0]
        draft_probs = draft.probs[:k] if draft and draft.probs is not None else None
        clock.lap("draft")

        feed = torch.cat([pending, draft_tokens])
        if settings.pad_drafts and 0 < draft_tokens.numel() < k:  # padding is scored, then dropped
            feed = torch.cat([feed, pending.expand(k - draft_tokens.numel())])
        output = cache.forward(feed[None], hidden=features)
        logits = output.logits[0, : 1 + draft_tokens.numel()]
        clock.lap("target")

        on_logits = logits.device
        verdict = verifier.verify(
            logits,
            draft_tokens.to(on_logits),
            None if draft_probs is None else draft_probs.to(on_logits),
            generator,
        )
        n = verdict.accepted
        emitted = draft_tokens[:n].tolist() + [verdict.next_token]
        clock.lap("verify")

        if features:  # pending and the accepted drafts stay in the target's cache
            drafter.observe_features(output.hidden_states[-1][0, : n + 1])
        cache.truncate(length + n)
        drafter.commit(length + n)
        clock.lap("rollback")

        emitted, reason = _cut_at_stop(emitted, eos, budget - produced)
        emitted_tensor = torch.tensor(emitted, dtype=torch.long)
        history[length : length + len(emitted)] = emitted_tensor
        positions = torch.arange(len(emitted), device=logits.device)
        emitted_logits = logits[positions].float()
        stats.sum_logprob += float(
            torch.log_softmax(emitted_logits, dim=-1)[positions, emitted_tensor.to(logits.device)].sum()
        )
        if observe is not None:
            observe(emitted_logits)
        length += len(emitted)
        produced += len(emitted)
        pending = emitted_tensor[-1:].to(device)
        stats.record_round(draft_tokens.numel(), min(n, len(emitted)), len(emitted))
        stats.relaxed += verdict.relaxed
        stats.examined += verdict.examined
        stats.low_margin += verdict.low_margin
        if settings.record_margins and verdict.margins is not None:
            stats.margins.extend(verdict.margins.tolist())
        if reason is None and stop_checker.hit(history[:length]):
            reason = "stop_string"
        clock.lap("other")
        stats.round_ends.append((clock.elapsed(), produced))
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


def _cut_at_stop(tokens: list[int], eos: set[int], remaining: int) -> tuple[list[int], str | None]:
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
