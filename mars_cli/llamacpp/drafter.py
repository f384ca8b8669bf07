"""A draft model on llama.cpp: another GGUF with the target's vocabulary (a smaller sibling, or the
same family at a lower precision), drafting a chain autoregressively in a context of its own.

Its cache follows the history as the transformers draft model's does (decoding/drafters.py's
ModelDrafter): `propose` feeds what the history holds beyond the cache (last round's accepted
tokens and the pending one) in one decode, then one token a step; `commit` cuts the cache back to
the tokens that stand. Greedy drafts are the argmax; sampled ones are drawn with the sequence's
own noise (`Drafter.draw`), so strict sampling emits what plain sampling would.
"""

from __future__ import annotations

import torch

from ..decoding.drafters import Drafter
from ..decoding.sampling import SamplingParams
from ..decoding.tree import CHAIN, DraftTree
from ..errors import require
from .engine import EngineSettings, LlamaEngine
from .scorer import COMMITTED


class LlamaModelDrafter(Drafter):
    """Chains from a GGUF draft model run by llama.cpp."""

    name = "model"
    shape = CHAIN

    def __init__(self, spec: str, target, sampling: SamplingParams, threads: int) -> None:
        from .target import gguf_file

        self.spec = spec
        self.sampling = sampling
        self.engine = LlamaEngine(gguf_file(spec), EngineSettings(context=target.context_window, threads=threads,
                                                                  sequences=1))
        self.engine.set_threads(threads)
        require(self.engine.vocab_size == target.vocab_size,
                f"draft model {spec} has a vocabulary of {self.engine.vocab_size} tokens, the target "
                f"{target.vocab_size}: a draft model must share the target's tokenizer")
        self.device = target.device
        self.reset()

    def reset(self) -> None:
        self.engine.clear()
        self.cached = 0  # history tokens in the draft model's cache
        self.failed = False

    def commit(self, length: int) -> None:
        if length < self.cached:
            self.engine.remove(COMMITTED, length, -1)
            self.cached = length

    @torch.inference_mode()
    def propose(self, history: torch.Tensor, depth: int) -> DraftTree:
        if self.failed or depth < 1:
            return DraftTree.empty(self.device)
        feed = [int(token) for token in history[self.cached :].tolist()]
        position = self.cached
        tokens: list[torch.Tensor] = []
        finite: list[torch.Tensor] = []
        for step in range(depth):
            logits = self._feed(feed, position)
            position += len(feed)
            token = self.next_in_chain(torch.from_numpy(logits[-1]), self.sampling, history.shape[0] + step, finite)
            tokens.append(token)
            feed = [int(token)]
        self.cached = position  # the history and every draft but the last
        if finite and not bool(torch.stack(finite).all()):
            return self.give_up(f"draft model {self.spec}", self.device)
        return DraftTree.chain(torch.stack(tokens))

    def _feed(self, tokens: list[int], position: int):
        """Decode `tokens` at `position` on, in batches the context takes; the last row's logits."""
        step = self.engine.settings.batch
        for start in range(0, len(tokens), step):
            chunk = tokens[start : start + step]
            last = start + step >= len(tokens)
            logits = self.engine.decode(chunk, range(position + start, position + start + len(chunk)),
                                        [(COMMITTED,)] * len(chunk), [False] * (len(chunk) - 1) + [last])
        return logits
