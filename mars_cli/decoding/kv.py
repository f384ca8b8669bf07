"""All KV-cache handling in one place.

transformers 5.x moved under us: 5.16 made `DynamicCache.crop` take a negative count of tokens
to drop, and 5.24 renamed the forward keyword `past_key_values` to `cache`. Nothing outside
this module touches a cache object.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Sequence

import torch
from transformers import DynamicCache


@lru_cache(maxsize=None)
def _cache_keyword(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


class KVCache:
    """A model's cache plus the one operation speculative decoding needs: keep some positions."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.keyword = _cache_keyword(type(model))
        self.cache = DynamicCache(config=model.config)
        # Sliding-window layers otherwise forget states that a rollback would need.
        if hasattr(self.cache, "activate_past_recording"):
            self.cache.activate_past_recording()

    def __len__(self) -> int:
        return int(self.cache.get_seq_length())

    def forward(self, input_ids: torch.Tensor, hidden: bool = False, **extra: object):
        """Run `input_ids` (shape [1, n]) after the cached prefix; returns the model output, with
        `hidden_states` when asked. `extra` (an attention mask, position ids) goes to the model."""
        if hidden:
            extra["output_hidden_states"] = True
        return self.model(input_ids=input_ids, **{self.keyword: self.cache, "use_cache": True}, **extra)

    def truncate(self, length: int) -> None:
        """Keep only the first `length` positions."""
        excess = len(self) - length
        if excess > 0:
            self.cache.crop(-excess)

    def keep(self, indices: Sequence[int] | torch.Tensor) -> None:
        """Make the cache hold exactly the positions `indices` (ascending), in that order.

        A prefix 0..n-1 is a crop. Otherwise the rows after the longest kept prefix are gathered
        into place, layer by layer, then cropped: a tree's accepted path becomes a chain. Rows are
        moved as computed, so their keys carry the positions they were scored at; a caller that
        gathers gives kept rows the positions they end up at (a tree's depth does)."""
        indices = torch.as_tensor(indices, dtype=torch.long).cpu()
        count = indices.numel()
        in_place = indices == torch.arange(count)
        prefix = count if bool(in_place.all()) else int(in_place.long().cumprod(0).sum())
        if prefix < count:
            if not bool((indices[1:] > indices[:-1]).all()) or int(indices[-1]) >= len(self):
                raise ValueError("keep: indices must be ascending positions inside the cache")
            self._gather(indices[prefix:], torch.arange(prefix, count))
        self.truncate(count)

    def _gather(self, sources: torch.Tensor, destinations: torch.Tensor) -> None:
        for layer in self.cache.layers:
            if not hasattr(layer, "keys") or not hasattr(layer, "values") or layer.keys is None:
                raise NotImplementedError(f"cannot gather rows of a {type(layer).__name__} cache layer")
            # a sliding-window layer stores only its last rows: shift absolute positions to its storage
            offset = layer.get_seq_length() - layer.keys.shape[-2]
            move = destinations >= offset  # rows before the stored window are never read again
            source = (sources[move] - offset).to(layer.keys.device)
            destination = (destinations[move] - offset).to(layer.keys.device)
            layer.keys[..., destination, :] = layer.keys[..., source, :]
            layer.values[..., destination, :] = layer.values[..., source, :]
