"""All KV-cache handling in one place.

transformers 5.x moved under us: 5.16 made `DynamicCache.crop` take a negative count of tokens
to drop, and 5.24 renamed the forward keyword `past_key_values` to `cache`. Nothing outside
this module touches a cache object.
"""

from __future__ import annotations

import inspect
from functools import lru_cache

import torch
from transformers import DynamicCache


@lru_cache(maxsize=None)
def _cache_keyword(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


class KVCache:
    """A model's cache plus the one operation speculative decoding needs: drop the last n."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.keyword = _cache_keyword(type(model))
        self.cache = DynamicCache(config=model.config)
        # Sliding-window layers otherwise forget states that a rollback would need.
        if hasattr(self.cache, "activate_past_recording"):
            self.cache.activate_past_recording()

    def __len__(self) -> int:
        return int(self.cache.get_seq_length())

    def forward(self, input_ids: torch.Tensor, hidden: bool = False):
        """Run `input_ids` (shape [1, n]) after the cached prefix; returns the model output, with
        `hidden_states` when asked (the last one is what the LM head reads)."""
        extra = {"output_hidden_states": True} if hidden else {}
        return self.model(input_ids=input_ids, **{self.keyword: self.cache, "use_cache": True}, **extra)

    def truncate(self, length: int) -> None:
        """Keep only the first `length` positions."""
        excess = len(self) - length
        if excess > 0:
            self.cache.crop(-excess)
