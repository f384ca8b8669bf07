"""The scorer: the one owner of the target's forward passes and its KV cache.

Each round the loop hands it the pending token and the drafts; it feeds them in one forward
(padding short drafts to the round's width), and hands back the logits of the real positions and,
for a drafter that reads them, the target's features there. Once the verifier has chosen which
fed positions stand, `keep(rows)` makes the cache hold exactly those (a prefix is a crop; any other
set is gathered into place first) and returns their features for the drafter.

Fed rows are numbered 0 (the pending token) .. k (the last draft); draft i sits at row i + 1.

Two cache modes: the default grows a `KVCache` and runs every forward eagerly (a target whose
linears run on this project's kernels, `--dtype q4`/`q4a8`, runs on the lean forward and its own
growing `LeanCache` instead, decoding/lean.py); `static_cache`
preallocates a `StaticKVCache` per scorer (reset in place for each sequence, regrown only when a
sequence needs more room), and `compile` runs the verification forwards (widths 1 and k + 1)
through one `torch.compile`d function (CUDA graphs on CUDA) while the prefill stays eager.
docs/architecture.md ("Static cache and compiled forwards") has the design and the measurements.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..errors import StaticCacheFull, UserError
from ..notes import note
from ..models import LoadedModel
from .kv import KVCache, StaticCacheUnsupported, StaticKVCache, compile_forward, sliding_window, static_cache_problem
from .lean import LeanCache, lean_forward
from .tree import DraftTree, attention_bias

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
    the drafter reads features, the features of every fed row ([width, F]); padding is dropped.
    `width`: the positions the forward fed, padding included (what its cost depends on)."""

    logits: torch.Tensor
    features: torch.Tensor | None
    width: int


COMPILE_CHOICES = ("auto", "on", "off")


def compile_unavailable(device: torch.device) -> str | None:
    """Why torch cannot compile forwards for `device` in this process (one sentence), or None:
    dynamo unsupported on this Python or platform; on CPU no C++ compiler for inductor; on CUDA
    no Triton."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        version = ".".join(map(str, sys.version_info[:2]))
        return f"torch {torch.__version__} cannot compile on this platform (Python {version})"
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "torch.compile needs Triton for CUDA, and it is not installed"
    elif device.type == "cpu":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
        except Exception:  # noqa: BLE001 - any failure to find one means the same to the user
            return "torch.compile on CPU needs a C++ compiler (g++ or clang++) and none was found"
    return None


def compile_pays(device: torch.device) -> bool:
    """Where `--compile auto` turns compiling on: CUDA, where an eager forward is bound by kernel
    launches and a captured graph removes most of that. Not on CPU: measured in
    docs/architecture.md, the compile time is not won back by a one-shot run."""
    return device.type == "cuda"


def resolve_compile(choice: str, target: LoadedModel) -> bool:
    """Whether to decode with the static cache and compiled forwards. `on` where it cannot be
    done is a `UserError`; `auto` then quietly stays eager."""
    if choice not in COMPILE_CHOICES:
        raise UserError(f"--compile {choice}: expected auto, on or off")
    if choice == "off":
        return False
    spread = len(set((getattr(target.model, "hf_device_map", None) or {}).values())) > 1
    problem = ("a model spread over devices (--device-map) is not compiled" if spread else None) \
        or compile_unavailable(target.device) or static_cache_problem(target.model, 1)
    if choice == "on":
        if problem is not None:
            raise UserError(f"--compile on: {problem}")
        return True
    return problem is None and compile_pays(target.device)


STATIC_BLOCK = 256  # static caches are sized in whole blocks: fewer distinct shapes, fewer compiles
DEFAULT_HEADROOM = 256  # positions a sequence may add after its context, unless the caller says


class TargetScorer:
    """The target model, its cache and its padding policy for one sequence at a time.

    Padding: a round with any draft feeds the width the loop asks for, padding short drafts with
    copies of the pending token. A forward's cost on CPU depends on its width unevenly
    (docs/head.md), so two widths are cheaper than k + 1 of them; the padding's logits are
    dropped and its cache rows go with the next `keep`.

    `static_cache`: a preallocated cache sized for the context plus `headroom` positions (what
    the loop may add: the token budget and the widest round), rounded up to whole `STATIC_BLOCK`s
    and at most the model's context window. `max_length` caps it lower (memory); a sequence that
    needs more fails with a `UserError` before its prefill, or with `fallback` runs on the growing
    cache instead (eagerly, with a note on stderr once). Never truncated.

    `compile`: static cache, and the verification forwards through `torch.compile` (`dynamic=False`;
    mode "reduce-overhead", i.e. CUDA graphs, on CUDA; the default mode elsewhere), built once per
    scorer and reused across sequences. Each fed width is one compiled graph, so drafts are always
    padded, and a round narrower than a width already compiled is padded up to it (the loop's
    rounds narrow near the token budget; padding is cheaper than a compile). The prefill is eager.
    """

    def __init__(self, target: LoadedModel, feature_layers: FeatureLayers = (), *,
                 static_cache: bool = False, compile: bool = False, headroom: int = DEFAULT_HEADROOM,
                 max_length: int | None = None, fallback: bool = False) -> None:
        self.target = target
        self.feature_layers = tuple(feature_layers)
        self.static = static_cache or compile
        self.compiled = compile
        self.headroom = headroom
        window = target.context_window
        self.max_length = min(x for x in (max_length, window, sys.maxsize) if x is not None)
        self.fallback = fallback
        self.sliding_window = sliding_window(target.model)  # trees are scored only within it
        self.cache: KVCache | StaticKVCache | LeanCache = self._growing_cache()
        self.committed = 0  # cache positions that are final (the loop's history minus `pending`)
        self._features: torch.Tensor | None = None  # last pass's features, until `keep` reads them
        self._static: StaticKVCache | None = None
        self._noted = False
        self._widths: set[int] = set()  # widths fed through the compiled forward so far
        self._step: Callable | None = None
        if compile:
            select = (lambda states: select_features(states, self.feature_layers)) if self.feature_layers else None
            self._step = compile_forward(target.model, select, cuda_graphs=target.device.type == "cuda")

    @property
    def compiled_widths(self) -> frozenset[int]:
        """The widths fed through the compiled forward so far (one graph each)."""
        return frozenset(self._widths)

    @property
    def kind(self) -> str:
        """What serves the current sequence: "dynamic", "static" or "compiled"."""
        if self.cache is not self._static:
            return "dynamic"
        return "compiled" if self.compiled else "static"

    def start(self, context: torch.Tensor, room: int | None = None) -> torch.Tensor | None:
        """A new sequence: an empty cache, then `context` ([n] token ids, may be empty) fed
        eagerly; returns its features when the drafter reads them. `room`: the positions this
        sequence may add after the context, if not `headroom` (a static cache is sized for it;
        a cost measurement that feeds one round at a time needs only its widest)."""
        self.committed = 0
        self._features = None
        room = self.headroom if room is None else room
        self.cache = self._static_cache_for(context.numel(), room) if self.static else self._growing_cache()
        if context.numel() == 0:
            return None
        with torch.inference_mode():
            output = self._forward(context, eager=True, prompt=True)
        self.committed = context.numel()
        return output.features

    def _static_cache_for(self, context: int, room: int) -> KVCache | StaticKVCache:
        """The scorer's static cache, emptied, with room for `context` + `room` positions
        (reallocated larger when it has not); or, with `fallback`, a growing cache."""
        window = self.target.context_window
        needed = context + room
        if window is not None:
            needed = min(needed, window)  # the loop stops at the window
        needed = max(needed, context + 1)
        problem = None
        if needed > self.max_length:
            problem = (f"the sequence needs {needed} cache positions (a {context}-token context and room for "
                       f"{needed - context} more) but the static cache holds at most {self.max_length}")
        elif self._static is None or self._static.capacity < needed:
            capacity = min(-(-needed // STATIC_BLOCK) * STATIC_BLOCK, self.max_length)
            try:
                self._static = StaticKVCache(self.target.model, capacity)
            except StaticCacheUnsupported:
                try:  # exactly what is needed may still fit (a sliding window shorter than a block)
                    self._static = StaticKVCache(self.target.model, needed)
                except StaticCacheUnsupported as error:
                    problem = str(error)
        if problem is None:
            with torch.inference_mode():
                self._static.reset()
            return self._static
        if not self.fallback:
            raise StaticCacheFull(problem)
        if not self._noted:
            note(f"{problem}; such sequences decode with the growing cache, uncompiled")
            self._noted = True
        return self._growing_cache()

    def _growing_cache(self) -> KVCache | LeanCache:
        """The eager forward's cache: the lean forward's where it serves the target as its linears
        are now (the quantized modes, decoding/lean.py), else transformers' growing one."""
        lean = lean_forward(self.target.model)
        return LeanCache(lean) if lean is not None else KVCache(self.target.model)

    def score(self, pending: torch.Tensor, tree: DraftTree, width: int, features: bool = True) -> Scored:
        """Feed `pending` ([1]) and the tree's nodes (at most width - 1) after the committed cache.
        A chain is fed with the causal mask; in a branching tree every row sees only its ancestors:
        one pass scores every branch, each row at the position its depth gives it. `features`
        False: the drafter will not read this pass's features (a plain round while drafting is
        off), so none are asked for (a compiled graph computes them anyway: they are dropped)."""
        drafts = tree.tokens.to(pending.device)
        feed = torch.cat([pending, drafts])
        if drafts.numel() > 0:  # padding is scored, then dropped
            width = max(width, feed.numel())
            if self.kind == "compiled":  # reuse a wider compiled width that fits
                room = self.cache.room()
                width = min((w for w in self._widths if width <= w <= room), default=width)
            if feed.numel() < width:
                feed = torch.cat([feed, pending.expand(width - feed.numel())])
        if isinstance(self.cache, StaticKVCache) and feed.numel() > self.cache.room():
            raise StaticCacheFull(f"the sequence outgrew its static cache ({self.cache.capacity} positions)")
        layout = None if tree.is_chain() else self._tree_layout(tree, feed.numel())
        with torch.inference_mode():
            output = self._forward(feed, layout=layout, features=features)
        real = 1 + drafts.numel()
        self._features = None if output.features is None or not features else output.features[:real]
        return Scored(output.logits[:real], self._features, feed.numel())

    def keep(self, rows: Sequence[int] | torch.Tensor) -> torch.Tensor | None:
        """Keep the fed rows `rows` (ascending; row 0, the pending token, always stands) after the
        committed prefix; everything else fed this round leaves the cache. Returns the features
        of the kept rows, in order, when the drafter reads them."""
        rows = [int(row) for row in rows]
        prefix = rows == list(range(len(rows)))  # a chain's accepted drafts: a crop, no index tensors
        with torch.inference_mode():  # a static cache's tensors are inference tensors
            if prefix:
                self.cache.truncate(self.committed + len(rows))
            else:
                self.cache.keep(torch.cat([torch.arange(self.committed), self.committed + torch.tensor(rows)]))
        self.committed += len(rows)
        if self._features is None:
            return None
        kept = self._features[: len(rows)] if prefix else self._features[torch.tensor(rows, device=self._features.device)]
        self._features = None
        return kept

    def rewind(self, length: int) -> None:
        """Forget everything after the first `length` committed positions (cost measurements
        time forwards of several widths after the same context)."""
        with torch.inference_mode():
            self.cache.truncate(length)
        self.committed = min(self.committed, length)
        self._features = None

    def tree_fits(self, width: int) -> bool:
        """Whether a tree `width` rows wide can be scored at this position: a model with sliding-
        window layers gets one mask for every layer, right only while the sequence is within the
        shortest window (the loop then drafts the tree's first branch as a chain)."""
        return self.sliding_window is None or self.committed + width <= self.sliding_window

    def _tree_layout(self, tree: DraftTree, width: int) -> dict[str, torch.Tensor]:
        """The mask and position ids of a tree fed after the committed cache (padded to `width`)."""
        past = self.committed
        if not self.tree_fits(width):  # the loop checks first; a caller that did not gets a clear error
            raise ValueError(f"a draft tree at position {past + width} is past the model's sliding window")
        kv_length = self.cache.capacity if isinstance(self.cache, StaticKVCache) else past + width
        device = self.target.device
        bias = attention_bias(tree.ancestry(width), past, kv_length, self.target.dtype)
        return {"attention_mask": bias.to(device), "position_ids": tree.positions(past, width).to(device)}

    def _forward(self, feed: torch.Tensor, eager: bool = False, layout: dict | None = None,
                 features: bool = True, prompt: bool = False) -> Scored:
        """The target over `feed` after the cached rows. `prompt`: a sequence's context, whose
        logits nobody reads: only its last row's are computed (a long prompt's logits for every
        row once took the vocabulary times the prompt in memory: 1.6 GB at 8,150 tokens)."""
        ids = feed[None].to(self.target.device)
        if not eager and self.kind == "compiled" and self.cache.initialized:
            # a copy made here (inference mode) is an inference tensor whatever the caller passed:
            # the compiled graph is guarded on that, and would otherwise be compiled twice
            if not self._widths:
                note("compiling the target's forwards, once per verification width (up to a minute each the first "
                     "time; torch caches them for later runs)")
            logits, features = self.cache.call(self._step, ids.clone(), layout)
            self._widths.add(ids.shape[1])
            if self.target.device.type == "cuda":  # a CUDA graph's outputs are overwritten by its next replay
                logits, features = logits.clone(), None if features is None else features.clone()
            return Scored(logits[0], None if features is None else features[0], ids.shape[1])
        hidden = bool(self.feature_layers) and features
        extra = dict(layout or {})
        if prompt and isinstance(self.cache, LeanCache):
            extra["prompt"] = True
        elif prompt:
            extra.update(last_logits(self.target.model))
        output = self.cache.forward(ids, hidden=hidden, **extra)
        selected = select_features(output.hidden_states, self.feature_layers)[0] if hidden else None
        return Scored(output.logits[0], selected, ids.shape[1])


def last_logits(model: torch.nn.Module) -> dict:
    """The keyword that makes a transformers model compute its last row's logits only, where its
    forward takes one (`logits_to_keep`); nothing otherwise."""
    import inspect

    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(type(model).forward).parameters else {}
