"""The scorer: the one owner of the target's forward passes and its KV cache.

Each round the loop hands it the pending token and the drafts; it feeds them in one forward
(padding short drafts to the round's width), and hands back the logits of the real positions and,
for a drafter that reads them, the target's features there. Once the verifier has chosen which
fed positions stand, `keep(rows)` makes the cache hold exactly those (a prefix is a crop; any other
set is gathered into place first) and returns their features for the drafter.

Fed rows are numbered 0 (the pending token) .. k (the last draft); draft i sits at row i + 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..models import LoadedModel
from .kv import KVCache

FeatureLayers = tuple[int, ...]
LAST_LAYER: FeatureLayers = (-1,)  # what the LM head reads (after the final norm)


def select_features(hidden_states: Sequence[torch.Tensor], layers: FeatureLayers) -> torch.Tensor:
    """The target's features for a drafter: the chosen entries of a model output's
    `hidden_states` (index 0 is the embedding output, -1 the final normed state), concatenated
    along the last dimension in the order given. Used by decoding and by head-training data."""
    if not layers:
        raise ValueError("select_features needs at least one layer")
    chosen = [hidden_states[layer] for layer in layers]
    return chosen[0] if len(chosen) == 1 else torch.cat(chosen, dim=-1)


@dataclass
class Scored:
    """One verification pass: logits of the pending token and each draft ([1 + k, V]) and, when
    the drafter reads features, the features of every fed row ([width, F]); padding is dropped."""

    logits: torch.Tensor
    features: torch.Tensor | None


class TargetScorer:
    """The target model, its cache and its padding policy for one sequence at a time.

    `pad_drafts`: feed k + 1 positions whenever a round has any draft, padding short drafts with
    copies of the pending token. A forward's cost on CPU depends on its width unevenly
    (docs/head.md), so two widths are cheaper than k + 1 of them; the padding's logits are
    dropped and its cache rows go with the next `keep`.
    """

    def __init__(self, target: LoadedModel, feature_layers: FeatureLayers = (), pad_drafts: bool = True) -> None:
        self.target = target
        self.feature_layers = tuple(feature_layers)
        self.pad_drafts = pad_drafts
        self.cache = KVCache(target.model)
        self.committed = 0  # cache positions that are final (the loop's history minus `pending`)
        self._features: torch.Tensor | None = None  # last pass's features, until `keep` reads them

    def start(self, context: torch.Tensor) -> torch.Tensor | None:
        """A new sequence: a fresh cache holding `context` ([n] token ids, may be empty);
        returns its features when the drafter reads them."""
        self.cache = KVCache(self.target.model)
        self.committed = 0
        self._features = None
        if context.numel() == 0:
            return None
        output = self._forward(context)
        self.committed = context.numel()
        return output.features

    def score(self, pending: torch.Tensor, drafts: torch.Tensor, width: int) -> Scored:
        """Feed `pending` ([1]) and `drafts` ([k'], k' <= width - 1) after the committed cache."""
        feed = torch.cat([pending, drafts])
        if self.pad_drafts and 0 < drafts.numel() < width - 1:  # padding is scored, then dropped
            feed = torch.cat([feed, pending.expand(width - 1 - drafts.numel())])
        output = self._forward(feed)
        real = 1 + drafts.numel()
        self._features = None if output.features is None else output.features[:real]
        return Scored(output.logits[:real], self._features)

    def keep(self, rows: Sequence[int] | torch.Tensor) -> torch.Tensor | None:
        """Keep the fed rows `rows` (ascending; row 0, the pending token, always stands) after the
        committed prefix; everything else fed this round leaves the cache. Returns the features
        of the kept rows, in order, when the drafter reads them."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        keep = torch.cat([torch.arange(self.committed), self.committed + rows])
        self.cache.keep(keep)
        self.committed = keep.numel()
        if self._features is None:
            return None
        kept = self._features[rows.to(self._features.device)]
        self._features = None
        return kept

    def _forward(self, feed: torch.Tensor) -> Scored:
        output = self.cache.forward(feed[None].to(self.target.device), hidden=bool(self.feature_layers))
        features = select_features(output.hidden_states, self.feature_layers)[0] if self.feature_layers else None
        return Scored(output.logits[0], features)
