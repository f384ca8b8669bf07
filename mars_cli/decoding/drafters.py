"""Drafters propose tokens; the target verifies them. Any drafter works with any rule.

Protocol: `reset()` before a new sequence; `propose(history, depth)` returns a `DraftTree` at most
`depth` deep (a chain is the one-branch tree: `depth` tokens); `commit(length)` tells the drafter
that only the first `length` tokens of the history are final, so it forgets anything cached past
them. A drafter's tree shape is part of its construction. A drafter that reads the target's
features (the draft head) names the hidden-state layers it reads in `feature_layers`; the scorer
then hands it the target's features of every position that enters the target's cache, from the
forward passes that run anyway, except in plain rounds after which no draft can follow
(`skip_features`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..errors import UserError
from ..models import LoadedModel
from ..notes import note
from .kv import KVCache, StaticCacheUnsupported, StaticKVCache, compile_forward
from .target import STATIC_BLOCK, FeatureLayers
from .tree import CHAIN, DraftTree, FrontierRows, TreeShape, bias_from_visibility, grow_tree, pool_size, tree_from_paths
from .sampling import PositionNoise, SamplingParams, coupled_sample, probabilities, process_logits


class Drafter(ABC):
    """The protocol. Only `propose` is required; the rest default to doing nothing, which is
    right for drafters that keep no state between rounds."""

    name = "drafter"
    feature_layers: FeatureLayers = ()  # target hidden states read (see target.select_features)
    noise: PositionNoise | None = None  # the sequence's sampling noise, set by the loop when it samples
    shape: TreeShape = CHAIN
    failed: bool = False  # proposed NaN or infinite probabilities: no drafting until `reset`

    def reset(self) -> None:
        """A new sequence starts: forget everything cached."""

    @abstractmethod
    def propose(self, history: torch.Tensor, depth: int) -> DraftTree:
        """A tree to follow `history` (CPU, prompt + emitted tokens): what the drafter searched at
        most `depth` deep; a branch that cost no drafting (prompt lookup's on a head tree) may reach
        further, and the loop cuts every tree to the room the token budget leaves."""

    def observe_features(self, hidden: torch.Tensor) -> None:
        """The target's features [n, F] (its `feature_layers`, concatenated) for the next n
        positions of its cache, in order."""

    def skip_features(self, count: int) -> None:
        """The next `count` positions of the target's cache came without features (a plain round
        while drafting is off: the loop did not ask for them)."""

    def commit(self, length: int) -> None:
        """Only the first `length` tokens of the history are final."""

    def give_up(self, who: str, device: torch.device | str) -> DraftTree:
        """A drafter whose distribution holds NaN or inf (a broken head, a draft model overflowing
        float16) is a drafter error, not the target's: it proposes nothing for the rest of the
        sequence, so the target decodes on alone, and says so once."""
        self.failed = True
        note(f"{who} proposed NaN or infinite probabilities; decoding on without drafting for the rest of the "
             f"sequence", once=True)
        return DraftTree.empty(device)

    def draw(self, processed: torch.Tensor, position: int) -> torch.Tensor:
        """A sampled draft for `position` of the sequence, from processed logits [V]: drawn with
        the target's own noise there, so where q and p agree the drafter proposes the very token
        the target draws (the chance they coincide is at least (1 - TV) / (1 + TV))."""
        if self.noise is None:  # drafting outside the loop: noise of its own
            self.noise = PositionNoise(None, processed.shape[-1], processed.device)
        return coupled_sample(processed, self.noise.rows([position], processed.shape[-1], processed.device)[0])

    def next_in_chain(self, logits: torch.Tensor, sampling: SamplingParams, position: int,
                      finite: list[torch.Tensor]) -> torch.Tensor:
        """A draft model's next chain token from its logits [V]: the argmax when greedy, else drawn
        with the sequence's noise at `position` (whether its distribution was finite appended to
        `finite`, read once a round)."""
        processed = process_logits(logits, sampling)
        if sampling.greedy:
            return processed.argmax(dim=-1)
        finite.append(self.finite(probabilities(processed)))
        return self.draw(processed, position)

    @staticmethod
    def finite(q: torch.Tensor) -> torch.Tensor:
        """Whether q holds no NaN or inf, a bool on q's device: no host sync here, the drafter
        reads the flags once per round."""
        return torch.isfinite(q).all()

    @staticmethod
    def finite_rows(logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For a tree search: (log-probabilities with NaN as -inf, whether every row had a finite
        best entry, on the device). The search then stays well-ordered (a NaN score could cut a
        parent and keep its child); the drafter discards the tree when the flag is false."""
        inf = float("inf")
        return logprobs.nan_to_num(nan=-inf, posinf=inf, neginf=-inf), torch.isfinite(logprobs.amax(dim=-1)).all()


class NoDrafter(Drafter):
    """Proposes nothing: every round is one plain autoregressive step of the target."""

    name = "none"

    def __init__(self, device: torch.device) -> None:
        self._empty = DraftTree.empty(device)

    def propose(self, history: torch.Tensor, depth: int) -> DraftTree:
        return self._empty


class NgramDrafter(Drafter):
    """Prompt lookup: find the most recent earlier occurrence of the last n tokens (n from
    `max_ngram` down to `min_ngram`) in prompt + generated text and propose what followed it."""

    name = "ngram"

    def __init__(self, device: torch.device, shape: TreeShape = CHAIN, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise UserError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_ngram}..{max_ngram}")
        self.device = device
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.shape = shape  # branching: up to topk continuations, as the branches of a tree

    def propose(self, history: torch.Tensor, depth: int) -> DraftTree:
        """`history` is the CPU token history; matching there avoids device round trips."""
        paths = self.continuations(history, depth, self.shape.topk)
        if len(paths) <= 1:
            return DraftTree.chain(torch.tensor(paths[0] if paths else [], dtype=torch.long, device=self.device))
        tree = tree_from_paths(paths, self.shape.tokens, self.device)
        tree.searched = depth
        return tree

    def continuations(self, history: torch.Tensor, k: int, wanted: int) -> list[list[int]]:
        """Up to `wanted` distinct continuations (k tokens at most) of the longest matching tail,
        most recent occurrence first; shorter tails add more only while fewer were found."""
        length = history.shape[0]
        paths: list[list[int]] = []
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            tail = history[length - n :]
            # windows starting at 0 .. length-n-1, i.e. every earlier occurrence of the tail
            windows = history[: length - 1].unfold(0, n, 1)
            hits = (windows == tail).all(dim=1).nonzero()[:, 0].tolist()
            for start in reversed(hits):
                proposal = history[start + n : start + n + k].tolist()
                if proposal and proposal not in paths:
                    paths.append(proposal)
                    if len(paths) == wanted:
                        return paths
        return paths


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """A draft model must score the same token ids as the target; refuse anything else."""
    probe = "Speculative decoding: 12 drafts, naïve café — 東京 ✓"
    target_width = target.vocab_size
    draft_width = draft.vocab_size
    problems = []
    if len(target.tokenizer) != len(draft.tokenizer):
        problems.append(f"vocabulary sizes {len(target.tokenizer)} vs {len(draft.tokenizer)}")
    elif target.tokenizer.encode(probe) != draft.tokenizer.encode(probe):
        problems.append("the same text tokenises differently")
    if target_width != draft_width:
        problems.append(f"output widths {target_width} vs {draft_width}")
    if problems:
        raise UserError(
            f"draft model {draft.spec!r} does not share the target's vocabulary ({'; '.join(problems)})"
        )


class ModelDrafter(Drafter):
    """A smaller causal LM with the target's vocabulary, drafting autoregressively with its
    own KV cache, which is rolled back together with the target's. With a branching shape it grows
    EAGLE-2's dynamic tree (decoding/tree.py), one forward of the draft model per level.

    `compile` (`--compile on`): a static cache and the drafting forwards (one token, or a tree
    level's frontier) through the compiled forward the scorer uses (kv.compile_forward: one
    graph per fed width, CUDA graphs on CUDA); reading the round's new tokens stays eager. The
    static cache grows in whole STATIC_BLOCKs; a larger one re-reads the history once."""

    name = "model"

    def __init__(self, draft: LoadedModel, sampling: SamplingParams, shape: TreeShape = CHAIN,
                 compile: bool = False) -> None:
        self.draft = draft
        self.sampling = sampling
        self.shape = shape
        self.compiled = compile
        self._cuda_graphs = compile and draft.device.type == "cuda"
        self._step = compile_forward(draft.model, cuda_graphs=self._cuda_graphs) if compile else None
        self._static: StaticKVCache | None = None
        self.reset()

    def reset(self) -> None:
        if self._static is not None:
            with torch.inference_mode():  # a static cache's tensors are inference tensors
                self._static.reset()
        self.cache: KVCache | StaticKVCache = KVCache(self.draft.model) if self._static is None else self._static
        self.failed = False

    def commit(self, length: int) -> None:
        with torch.inference_mode():  # a static cache's tensors are inference tensors
            self.cache.truncate(length)

    def _forward(self, tokens: torch.Tensor, **layout: torch.Tensor) -> torch.Tensor:
        """The draft model's logits [n, V] for `tokens` ([1, n]) fed after its cache: compiled for
        drafting steps when the cache has been filled once, eager otherwise."""
        if self._step is None or not self.cache.initialized:
            return self.cache.forward(tokens, **layout).logits[0]
        logits, _ = self.cache.call(self._step, tokens.clone(), layout or None)
        return logits[0].clone() if self._cuda_graphs else logits[0]

    def _make_room(self, history: torch.Tensor, positions: int) -> None:
        """With `compile`: a static cache with room for `positions` more than the history; a
        larger one (new graphs) reads the history again from the start."""
        if self._step is None:
            return
        needed = history.shape[0] + positions
        if self._static is not None and needed <= self._static.capacity:
            return
        capacity = -(-needed // STATIC_BLOCK) * STATIC_BLOCK
        if self._static is not None:
            capacity = max(capacity, 2 * self._static.capacity)
        for size in (capacity, needed):  # whole blocks; else exactly what is needed (a short sliding window)
            try:
                self._static = StaticKVCache(self.draft.model, size)
                break
            except StaticCacheUnsupported:
                continue
        else:  # this sequence cannot fit a static cache of the draft model: eager from here on
            note(f"draft model {self.draft.spec}: {needed} positions do not fit a static cache; drafting "
                 "eagerly on a growing cache", once=True)
            self._step, self._static = None, None
            self.cache = KVCache(self.draft.model)
            return
        self.cache = self._static

    @torch.inference_mode()
    def propose(self, history: torch.Tensor, depth: int) -> DraftTree:
        if self.failed:
            return DraftTree.empty(self.draft.device)
        self._make_room(history, depth * max(self.shape.topk, 1))
        feed = history[len(self.cache) :].to(self.draft.device)[None]
        if self.shape.branches:
            return self._propose_tree(feed, depth)
        tokens, finite = [], []
        for step in range(depth):
            logits = (self.cache.forward(feed).logits[0] if step == 0 else self._forward(feed))[-1]
            token = self.next_in_chain(logits, self.sampling, history.shape[0] + step, finite)
            tokens.append(token)
            feed = token.reshape(1, 1)
        if not tokens:
            return DraftTree.empty(self.draft.device)
        if finite and not bool(torch.stack(finite).all()):  # the round's one host sync for this check
            return self.give_up(f"draft model {self.draft.spec}", self.draft.device)
        return DraftTree.chain(torch.stack(tokens))

    def _logprobs(self, logits: torch.Tensor, finite: list[torch.Tensor]) -> torch.Tensor:
        """Processed log-probabilities, NaN as -inf; whether they were finite appended to `finite`."""
        logprobs, ok = self.finite_rows(torch.log_softmax(process_logits(logits, self.sampling), dim=-1))
        finite.append(ok)
        return logprobs

    def _propose_tree(self, feed: torch.Tensor, depth: int) -> DraftTree:
        """Each level feeds the frontier after the history, every node seeing the history and
        its own ancestors, at the position its depth gives it; the drafted rows leave the cache
        when the tree is grown (the accepted tokens are fed again next round)."""
        base = len(self.cache) + feed.shape[1]  # the history's length once fed
        finite: list[torch.Tensor] = []
        root = self._logprobs(self.cache.forward(feed).logits[0, -1], finite)
        rows = FrontierRows(base, pool_size(self.shape.topk, depth), root.device)

        def expand(nodes: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
            visible, level = rows.place(nodes, parents, len(self.cache))
            if isinstance(self.cache, StaticKVCache):  # the mask spans the whole static cache
                visible = torch.cat([visible, visible.new_zeros(visible.shape[0], self.cache.capacity
                                                                - visible.shape[1])], dim=1)
            device = self.draft.device
            positions = torch.full((1, nodes.numel()), base - 1 + level, device=device)
            mask = bias_from_visibility(visible, self.draft.dtype).to(device)
            logits = self._forward(tokens.to(device)[None], attention_mask=mask, position_ids=positions)
            return self._logprobs(logits, finite)

        tree = grow_tree(root, expand, self.shape.topk, depth, self.shape.tokens)
        self.cache.truncate(base)
        if not bool(torch.stack(finite).all()):  # after cut_tree's own transfer: no extra stall
            return self.give_up(f"draft model {self.draft.spec}", self.draft.device)
        tree.searched = depth
        return tree
