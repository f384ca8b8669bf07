"""What both draft heads are made of: `PairHead`, the base class that owns the drafting
arithmetic, and the pieces the two kinds (model.DraftHead, EAGLE-1 style; eagle3.Eagle3Head)
build their layer from: RMS norm, RoPE, the q/k/v projection, the target's embeddings they
borrow, the fp16 weights file. Kept in one place so the two heads cannot drift apart.

At position p a head reads the pair (f_p, x_{p+1}): the target's features at p and the embedding
of the token that followed. It predicts a state from which it scores the next token, and while
drafting it feeds that state back with the token it just drafted. `PairHead` owns what every such
head shares: reading pairs into its own KV cache (`step`), the compiled drafting step (`extend`)
and the training-time unroll (`unrolled`); a subclass says how a pair is projected (`_project`,
usually through `_attention_inputs`), how the attention output becomes the fed-back state
(`_finish`) and how that state is scored (`logits`, over `vocab_ids`, the target token id of each
output row).
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..decoding.acceptance import DraftAcceptance
from ..errors import UserError


# --------------------------------------------------------------------------- layers
class RMSNorm(nn.Module):
    """Llama's RMS norm (both heads' norms; their checkpoints name its one tensor `weight`)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


# --------------------------------------------------------------------------- RoPE
def plain_inverse_frequencies(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """Unscaled RoPE's 1 / theta^(2i / d), float32 [d / 2], computed on `device` (the single-file
    head's RoPE; an EAGLE-3 head takes its own from transformers, scaled variants included)."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)


def rope_tables(positions: torch.Tensor, inverse: torch.Tensor, dtype: torch.dtype,
                scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, d] at `positions` ([T]): computed in float32 whatever the head's dtype, then
    cast to `dtype`; `scale` is the attention scaling some RoPE variants apply (1: none)."""
    angles = positions.float()[:, None] * inverse.to(positions.device)[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos(), angles.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the halves of the last dimension (the Llama layout, not interleaved pairs)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


# --------------------------------------------------------------------------- the heads' base
class HeadCache:
    """Keys and values of the pairs the head has read, [heads, T, head_dim]; rolled back by slicing."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat([self.keys, keys], dim=1)
            self.values = torch.cat([self.values, values], dim=1)
        return self.keys, self.values

    def truncate(self, length: int) -> None:
        if self.keys is not None and self.keys.shape[1] > length:
            self.keys = self.keys[:, :length]
            self.values = self.values[:, :length]


class StaticHeadCache(HeadCache):
    """A head cache of fixed capacity, preallocated ([kv heads, capacity, head_dim] each), for
    `--compile on`: a compiled drafting step (`PairHead.extend`) writes its pairs in place and
    attends over the whole buffer through a mask, so its shapes never change with the sequence's
    length (one graph per number of pairs a step reads; CUDA graphs on CUDA). Reading true pairs,
    whose number varies, stays eager through `append`, which returns the filled part."""

    def __init__(self, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self.buffers = (torch.zeros(kv_heads, capacity, head_dim, dtype=dtype, device=device),
                        torch.zeros(kv_heads, capacity, head_dim, dtype=dtype, device=device))
        from torch import _dynamo

        for buffer in self.buffers:  # the same tensors every call: a captured graph may read them in place
            _dynamo.mark_static_address(buffer)

    def __len__(self) -> int:
        return self.length

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + keys.shape[1]
        if end > self.capacity:
            raise ValueError(f"the head's static cache holds {self.capacity} pairs, {end} were asked for")
        self.buffers[0][:, self.length : end] = keys
        self.buffers[1][:, self.length : end] = values
        self.length = end
        return self.buffers[0][:, :end], self.buffers[1][:, :end]

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)


class PairHead(nn.Module, ABC):
    """What every feature-reading draft head shares; see the module docstring."""

    vocab_ids: torch.Tensor  # [rows of logits()] -> target token id
    fc: nn.Linear  # the first layer; its weight's device and dtype are the head's
    head_dim: int
    num_heads: int
    num_kv_heads: int
    rope_scale: float = 1.0  # RoPE's attention scaling (scaled variants of EAGLE-3 heads)

    def __init__(self) -> None:
        super().__init__()
        # the target's input embeddings, borrowed by attach(): never trained, never saved
        self.embed: nn.Module | None = None
        self.source: str | None = None  # the file or directory it was loaded from

    @property
    @abstractmethod
    def feature_width(self) -> int:
        """Width of the target features a pair reads (the concatenation of `feature_layers`)."""

    @property
    @abstractmethod
    def target_vocab_size(self) -> int:
        """Size of the target's vocabulary (sampling scatters the head's rows into it)."""

    @property
    @abstractmethod
    def target_name(self) -> str:
        """The target it was made for, as recorded (empty when it records none)."""

    @abstractmethod
    def feature_layers_for(self, target_model: nn.Module) -> tuple[int, ...]:
        """Which entries of the target's `hidden_states` it reads (see target.select_features)."""

    @property
    def acceptance(self) -> DraftAcceptance | None:
        """Its measured acceptance, when its files record it (decoding/acceptance.py)."""
        return None

    @abstractmethod
    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """Scores of a state over the head's rows (`vocab_ids` maps each to a target token)."""

    @abstractmethod
    def _inverse_frequencies(self, device: torch.device) -> torch.Tensor:
        """RoPE's inverse frequencies, float32 [head_dim / 2], on `device`."""

    @abstractmethod
    def _project(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor):
        """Pairs -> (residual stream, q [.., heads, T, d], k, v [.., kv heads, T, d]), RoPE applied."""

    @abstractmethod
    def _finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual stream and attention output [..., heads, T, d] -> the state fed back [..., T, h]."""

    # ------------------------------------------------------------------ target coupling
    def attach(self, target_model: nn.Module) -> "PairHead":
        """Borrow the target's input embeddings (a subclass calls this, then takes what else it
        needs). Returns the head, so loading and attaching read as one expression."""
        # a plain attribute, not a submodule: the target's embeddings are neither trained nor saved
        object.__setattr__(self, "embed", target_model.get_input_embeddings())
        return self

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's embeddings of `tokens`, on the head's device and in its dtype (the target
        may sit elsewhere, or compute in another dtype)."""
        weight = self.fc.weight
        # no gradient: the embeddings are the target's, not trained (with one, every training
        # step built and summed a dense vocabulary-wide gradient into the target's weights)
        with torch.no_grad():
            return self.embed(tokens.to(self.embed.weight.device)).to(weight.device, weight.dtype)

    # ------------------------------------------------------------------ the layer's pieces
    def _attention_inputs(self, x: torch.Tensor, projections: tuple[nn.Linear, nn.Linear, nn.Linear],
                          positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the attention reads ([..., T, width] -> q [..., heads, T, d], k and v
        [..., kv heads, T, d]) through the (q, k, v) `projections`, RoPE at `positions` on q, k."""
        q_proj, k_proj, v_proj = projections
        d = self.head_dim
        q = q_proj(x).unflatten(-1, (self.num_heads, d)).transpose(-3, -2)
        k = k_proj(x).unflatten(-1, (self.num_kv_heads, d)).transpose(-3, -2)
        v = v_proj(x).unflatten(-1, (self.num_kv_heads, d)).transpose(-3, -2)
        cos, sin = rope_tables(positions, self._inverse_frequencies(positions.device), q.dtype, self.rope_scale)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _expand_kv(self, keys: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention: repeat each key/value head for the query heads that share it."""
        groups = self.num_heads // self.num_kv_heads
        return keys if groups == 1 else keys.repeat_interleave(groups, dim=-3)

    # ------------------------------------------------------------------ drafting
    def step(self, features: torch.Tensor, tokens: torch.Tensor, cache: HeadCache,
             positions: torch.Tensor | None = None, visible: torch.Tensor | None = None) -> torch.Tensor:
        """Read n new pairs ([n, F] features or fed-back states, [n] tokens) after the cached
        ones; returns the states to score and feed back [n, h]. By default they sit at the next
        positions and each sees the cache and the new pairs before it; a draft tree gives each
        pair its own position and what it sees (`visible`, [n, cached + n] bool)."""
        start = len(cache)
        n = tokens.shape[0]
        if positions is None:
            positions = torch.arange(start, start + n, device=self._device())
        x, q, k, v = self._project(features, tokens, positions)
        keys, values = cache.append(k, v)
        mask = visible
        if mask is None and n > 1:  # new pairs see the cache and the new pairs before them
            mask = torch.ones(n, keys.shape[1], dtype=torch.bool, device=q.device).tril(keys.shape[1] - n)
        attended = F.scaled_dot_product_attention(q, self._expand_kv(keys), self._expand_kv(values), attn_mask=mask)
        return self._finish(x, attended)

    def extend(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """A drafting step as a function of fixed shapes, for `torch.compile`: n new pairs ([n, h]
        fed-back states, [n] tokens, [n] RoPE positions) written into the static buffers `keys`/
        `values` ([kv heads, capacity, d]) at rows `slots` ([n]), each attending to the rows
        `visible` marks ([n, capacity] bool). Returns the states [n, h]. Same arithmetic as `step`."""
        x, q, k, v = self._project(features, tokens, positions)
        keys.index_copy_(1, slots, k)
        values.index_copy_(1, slots, v)
        attended = F.scaled_dot_product_attention(q, self._expand_kv(keys), self._expand_kv(values),
                                                  attn_mask=visible)
        return self._finish(x, attended)

    def _device(self) -> torch.device:
        return next(self.parameters()).device

    # ------------------------------------------------------------------ training
    def unrolled(self, features: torch.Tensor, tokens: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """Teacher-forced pairs for a batch ([B, T, F] true features, [B, T] next tokens), then
        `depth - 1` more passes in which each position reads the head's own previous state
        (training-time test, EAGLE-3's name for it).

        Pass d at position i reproduces draft step d exactly: it reads (o_{d-1}[i-1], x_{i+1})
        and attends to the true pairs up to i-d+1 plus its own chain of predicted pairs at
        i-d+2 .. i (one per earlier pass), as the cache holds them while drafting. Returns the
        states of each pass, [B, T, h]; pass d is meaningful from i = d-1 on.
        """
        steps = features.shape[1]
        positions = torch.arange(steps, device=features.device)
        x, q, k, v = self._project(features, tokens, positions)
        k, v = self._expand_kv(k), self._expand_kv(v)
        outputs = [self._finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))]
        chain_keys, chain_values = [], []  # per pass >= 2: that pass's keys/values
        scale = 1.0 / math.sqrt(self.head_dim)
        for d in range(2, depth + 1):
            previous = F.pad(outputs[-1][:, :-1], (0, 0, 1, 0))  # o_{d-1}[i-1] at position i
            x_d, q_d, k_d, v_d = self._project(previous, tokens, positions)
            chain_keys.append(self._expand_kv(k_d))
            chain_values.append(self._expand_kv(v_d))
            true_scores = (q_d @ k.transpose(-1, -2)) * scale  # [B, heads, T, T]
            allowed = torch.ones(steps, steps, dtype=torch.bool, device=q.device).tril(-(d - 1))
            true_scores = true_scores.masked_fill(~allowed, float("-inf"))
            chain_scores, chain_vals = [], []
            for e, (k_e, v_e) in enumerate(zip(chain_keys, chain_values), start=2):
                shift = d - e  # pass e's pair sits `shift` positions before i
                k_shifted = F.pad(k_e, (0, 0, shift, 0))[..., :steps, :]
                v_shifted = F.pad(v_e, (0, 0, shift, 0))[..., :steps, :]
                score = (q_d * k_shifted).sum(-1, keepdim=True) * scale
                if shift:
                    score[..., :shift, :] = float("-inf")
                chain_scores.append(score)
                chain_vals.append(v_shifted)
            weights = torch.softmax(torch.cat([true_scores] + chain_scores, dim=-1), dim=-1)
            attended = weights[..., :steps] @ v
            for index, v_e in enumerate(chain_vals):
                attended = attended + weights[..., steps + index : steps + index + 1] * v_e
            outputs.append(self._finish(x_d, attended))
        return outputs

    # ------------------------------------------------------------------ files
    def _save_weights(self, path: Path, metadata: dict[str, str], head: Path | None = None) -> None:
        """The state dict as safetensors, floating tensors in fp16 (how heads ship), written to
        `<name>.tmp` then renamed: a killed run never leaves half a file under the real name. It
        gets the mode config.json gets (the old file's, else 0666 less the umask), so a head's two
        files are readable by the same people. Weights that are NaN or infinite (in fp16: also
        beyond 65504) are refused before anything is written (`head`, the head's name in the
        message: `path` unless given): such a head would only make every draft NaN, and would
        replace a good one under the same name."""
        from safetensors.torch import save_file

        from ..paths import default_mode, saving

        tensors = {name: (t.to(torch.float16) if t.is_floating_point() else t).contiguous().cpu()
                   for name, t in self.state_dict().items()}
        broken = [name for name, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if broken:
            shown = ", ".join(broken[:3]) + (f" and {len(broken) - 3} more" if len(broken) > 3 else "")
            raise UserError(f"draft head {head or path} not saved: {shown} hold NaN or infinite values "
                            f"(training diverged: try a lower --lr)")
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        with saving(path, temporary):
            save_file(tensors, str(temporary), metadata=metadata)
        os.chmod(temporary, default_mode(path))
        temporary.replace(path)
