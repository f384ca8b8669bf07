"""All KV-cache handling in one place.

transformers 5.x moved under us: 5.16 made `DynamicCache.crop` take a negative count of tokens
to drop, and 5.24 renamed the forward keyword `past_key_values` to `cache`. Nothing outside
this module touches a cache object (a compiled forward gets one handed in by `StaticKVCache.call`).

`KVCache` grows as it goes (eager decoding); `StaticKVCache` is preallocated, for compiled
forwards of fixed shapes. Both keep the same positions the same way (`keep`).
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Callable, Sequence

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

from ..models import text_config


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
        _keep(self, indices)

    def _row_offset(self, layer) -> int:
        """Position of a layer's first stored row: a sliding-window layer stores only its last rows."""
        return layer.get_seq_length() - layer.keys.shape[-2]


class CacheGatherUnsupported(ValueError):
    """A cache layer that stores no per-position rows (linear attention) cannot gather them."""


def _keep(cache: "KVCache | StaticKVCache", indices: Sequence[int] | torch.Tensor) -> None:
    """`keep` for both caches: crop a prefix; otherwise move the rows after the longest kept prefix
    into place in every layer (at `cache._row_offset(layer)` in its storage), then crop."""
    indices = torch.as_tensor(indices, dtype=torch.long).cpu()
    count = indices.numel()
    in_place = indices == torch.arange(count)
    prefix = count if bool(in_place.all()) else int(in_place.long().cumprod(0).sum())
    if prefix < count:
        if not bool((indices[1:] > indices[:-1]).all()) or int(indices[-1]) >= len(cache):
            raise ValueError("keep: indices must be ascending positions inside the cache")
        sources = indices[prefix:]  # kept rows past the prefix; they land on rows prefix .. count - 1
        gathers: dict[tuple[int, torch.device], torch.Tensor] = {}  # one index per storage offset and device
        for layer in cache.cache.layers:
            if getattr(layer, "keys", None) is None or getattr(layer, "values", None) is None:
                raise CacheGatherUnsupported(f"cannot gather rows of a {type(layer).__name__} cache layer")
            offset = cache._row_offset(layer)
            first = max(prefix, offset)  # rows before a sliding window's storage are never read again
            if first >= count:
                continue
            key = (offset, layer.keys.device)
            if key not in gathers:
                gathers[key] = (sources[first - prefix :] - offset).to(layer.keys.device)
            source, rows = gathers[key], slice(first - offset, count - offset)
            layer.keys[..., rows, :] = layer.keys.index_select(-2, source)  # a copy first: rows may overlap
            layer.values[..., rows, :] = layer.values.index_select(-2, source)
    cache.truncate(count)


class StaticCacheUnsupported(ValueError):
    """The model's cache layers cannot serve as a static cache of the asked length."""


class _RollbackLayer(StaticLayer):
    """transformers' static layer, croppable whatever the transformers version: 5.24 added
    `StaticLayer.crop`, before it a static cache could not roll back. A static layer stores
    position p at row p and its length in a tensor (`cumulative_length`), so a crop only moves that
    length back, in place (CUDA graphs hold its address); stale rows are overwritten next."""

    is_croppable = True

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("a static layer is cropped by a negative count of tokens to remove")
        self.cumulative_length.sub_(-tokens_to_remove)


class _WindowWithinCapacity(_RollbackLayer):
    """A sliding-window layer whose window is at least the cache's capacity: no position in the
    cache is ever out of another's window, so it is a plain static layer (croppable, and its length
    lives in a tensor, not in the Python int transformers' `StaticSlidingWindowLayer` keeps, which a
    compiled forward would specialise on: one compile per position). `is_sliding` stays True so
    masks are still built per layer type (the window overlay never masks anything here)."""

    is_sliding = True


class StaticKVCache:
    """A preallocated cache of `capacity` positions (transformers' `StaticCache`) with KVCache's
    interface, for fixed-shape (compiled, CUDA-graph) forwards.

    Its tensors never move: `reset()` clears it in place for the next sequence, `truncate` moves
    the write position back (`StaticLayer.crop`), `keep` gathers rows in place. Every forward gets
    explicit `position_ids` (the next `len(self)` positions): a static cache's length is a tensor,
    and the model would otherwise derive positions from it. Masks come from the cache's tensor
    length, so rows past the write position (left over from a crop or an earlier sequence) are never
    attended. The length is also tracked as a Python int, so bookkeeping never reads the device.
    Sliding-window layers work when the capacity fits in their window; longer is refused."""

    def __init__(self, model: torch.nn.Module, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a static cache needs at least one position, got {capacity}")
        self.model = model
        self.keyword = _cache_keyword(type(model))
        self.capacity = capacity
        self.cache = StaticCache(config=model.config, max_cache_len=capacity)
        for index, layer in enumerate(self.cache.layers):
            if type(layer) is StaticSlidingWindowLayer:
                window = int(getattr(layer, "max_cache_len"))  # min(window, capacity)
                if window < capacity:
                    raise StaticCacheUnsupported(
                        f"a static cache of {capacity} positions is longer than the model's sliding window "
                        f"({window}); its sliding layers could not roll back")
                self.cache.layers[index] = _WindowWithinCapacity(max_cache_len=capacity)
            elif type(layer) is StaticLayer:
                self.cache.layers[index] = _RollbackLayer(max_cache_len=capacity)
            else:
                raise StaticCacheUnsupported(f"{type(layer).__name__} cache layers cannot be used as a static cache")
        self.length = 0

    @property
    def initialized(self) -> bool:
        """Whether the layers have allocated their tensors (the first forward does, eagerly)."""
        return all(layer.is_initialized for layer in self.cache.layers)

    def __len__(self) -> int:
        return self.length

    def room(self) -> int:
        return self.capacity - self.length

    def positions(self, count: int, device: torch.device) -> torch.Tensor:
        """The position ids of the next `count` fed tokens ([1, count])."""
        if count > self.room():
            raise ValueError(f"{count} more positions do not fit the static cache "
                             f"({self.length} of {self.capacity} used)")
        return torch.arange(self.length, self.length + count, device=device)[None]

    def forward(self, input_ids: torch.Tensor, hidden: bool = False, **extra: object):
        """Eagerly run `input_ids` ([1, n]) after the cached prefix, as `KVCache.forward`."""
        if hidden:
            extra["output_hidden_states"] = True
        positions = self.positions(input_ids.shape[1], input_ids.device)  # checks there is room
        extra.setdefault("position_ids", positions)  # a tree's caller gives its own
        output = self.model(input_ids=input_ids, **{self.keyword: self.cache, "use_cache": True}, **extra)
        self.length += input_ids.shape[1]
        return output

    def call(self, function, input_ids: torch.Tensor, layout: dict | None = None):
        """Run `function(cache, input_ids, position_ids, attention_mask)`, a (compiled) forward
        that writes `input_ids` ([1, n]) into the transformers cache `cache`; returns what it
        returns. `layout` (a draft tree's mask and positions) replaces the causal defaults."""
        position_ids = self.positions(input_ids.shape[1], input_ids.device)  # checks there is room
        mask = None
        if layout is not None:
            position_ids, mask = layout["position_ids"], layout["attention_mask"]
        result = function(self.cache, input_ids, position_ids, mask)
        self.length += input_ids.shape[1]
        return result

    def truncate(self, length: int) -> None:
        excess = self.length - length
        if excess > 0:
            for layer in self.cache.layers:  # every layer is a _RollbackLayer (see __init__)
                layer.crop(-excess)
            self.length = length

    def reset(self) -> None:
        """Empty the cache in place (the tensors keep their addresses, as CUDA graphs need)."""
        self.cache.reset()
        self.length = 0

    def keep(self, indices: Sequence[int] | torch.Tensor) -> None:
        _keep(self, indices)

    def _row_offset(self, layer) -> int:
        return 0  # static layers store position p at row p


def sliding_window(model: torch.nn.Module) -> int | None:
    """The shortest sliding attention window of the model's layers, or None when none slides. A
    draft tree's 4D mask covers every layer alike, so it is valid only within that window."""
    config = text_config(model)
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not window or (types is not None and "sliding_attention" not in types):
        return None
    return int(window)


def static_cache_problem(model: torch.nn.Module, capacity: int) -> str | None:
    """Why `model` cannot decode with a static cache of `capacity` positions, or None."""
    try:
        StaticKVCache(model, capacity)
    except StaticCacheUnsupported as error:
        return str(error)
    return None


RECOMPILE_LIMIT = 64  # graphs per compiled forward: (widths fed) x (static caches alive in this process)


def compile_forward(model: torch.nn.Module, select: Callable | None = None, cuda_graphs: bool = False) -> Callable:
    """`model`'s forward, compiled for `StaticKVCache.call`: `(cache, input_ids, position_ids) ->
    (logits, select(hidden_states) or None)`, with `dynamic=False` (one graph per fed width) and,
    with `cuda_graphs`, mode "reduce-overhead" (the graph is captured once and replayed; its
    outputs are overwritten by the next call, so the caller copies what it keeps)."""
    keyword = _cache_keyword(type(model))

    def forward(cache, input_ids, position_ids, attention_mask=None):
        output = model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=True,
                       output_hidden_states=select is not None, **{keyword: cache})
        return output.logits, (None if select is None else select(output.hidden_states))

    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    compiled = torch.compile(forward, mode="reduce-overhead" if cuda_graphs else None, dynamic=False)
    if not cuda_graphs:
        return compiled

    def replay(cache, input_ids, position_ids, attention_mask=None):
        torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs may be overwritten
        return compiled(cache, input_ids, position_ids, attention_mask)

    return replay
