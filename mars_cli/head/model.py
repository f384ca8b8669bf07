"""Draft heads that read the target's features: the shared drafting arithmetic (`PairHead`) and
the original single-file head (`DraftHead`, EAGLE-1 style). The EAGLE-3 head lives in eagle3.py.

At position p a head reads the pair (f_p, x_{p+1}): the target's features at p and the embedding
of the token that followed. It predicts a state from which it scores the next token, and while
drafting it feeds that state back with the token it just drafted. `PairHead` owns what every such
head shares: reading pairs into its own KV cache (`step`), the compiled one-token step (`extend`)
and the training-time unroll (`unrolled`); a subclass says how a pair is projected (`_project`),
how the attention output becomes the fed-back state (`_finish`) and how that state is scored
(`logits`, over `vocab_ids`, the target token id of each output row).

`DraftHead` predicts the target's last hidden state f_{p+1}; its LM head is the target's own, cut
to a frequency-ranked subset of the vocabulary. Only the small trainable part is saved (fc, one
decoder layer, norms: about 4.6M parameters for SmolLM2-135M); the embeddings and LM-head rows
are borrowed, frozen, from the target at load time. Its file is safetensors: fp16 weights, the
subset's token ids, and a JSON `config` entry in the metadata (shape, target, training recipe).
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError

FORMAT = "mars-draft-head/1"


@dataclass
class HeadConfig:
    hidden_size: int
    num_heads: int
    intermediate_size: int
    vocab_size: int  # the target's full vocabulary
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    target: str = ""  # the target's spec when trained
    target_fingerprint: str = ""
    recipe: dict = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def for_target(cls, model: nn.Module, **extra) -> "HeadConfig":
        config = getattr(model.config, "text_config", model.config)
        hidden = int(config.hidden_size)
        head_dim = int(getattr(config, "head_dim", None) or 64)
        num_heads = max(1, hidden // head_dim) if hidden % head_dim == 0 else 1
        rope = getattr(config, "rope_parameters", None)  # transformers 5 moved rope_theta in here
        theta = float((rope.get("rope_theta") if isinstance(rope, dict) else None)
                      or getattr(config, "rope_theta", 10000.0))
        width = model.get_output_embeddings().weight.shape[0]
        return cls(hidden_size=hidden, num_heads=num_heads,
                   intermediate_size=int(getattr(config, "intermediate_size", 4 * hidden)),
                   vocab_size=int(width), rope_theta=theta,
                   rms_eps=float(getattr(config, "rms_norm_eps", 1e-5)), **extra)


def config_fields(metadata: dict | None) -> dict | None:
    """The HeadConfig fields stored in a safetensors file's metadata; None if not a head."""
    if not metadata or metadata.get("format") != FORMAT or "config" not in metadata:
        return None
    try:
        return json.loads(metadata["config"])
    except ValueError:
        return None


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inverse = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.float()[:, None] * inverse[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


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


class PairHead(nn.Module, ABC):
    """What every feature-reading draft head shares; see the module docstring."""

    vocab_ids: torch.Tensor  # [rows of logits()] -> target token id
    source: str | None = None  # the file or directory it was loaded from
    head_dim: int
    num_heads: int
    num_kv_heads: int

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

    @abstractmethod
    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """Scores of a state over the head's rows (`vocab_ids` maps each to a target token)."""

    @abstractmethod
    def _project(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor):
        """Pairs -> (residual stream, q [.., heads, T, d], k, v [.., kv heads, T, d]), RoPE applied."""

    @abstractmethod
    def _finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual stream and attention output [..., heads, T, d] -> the state fed back [..., T, h]."""

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

    def extend(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
               keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One drafting step as a pure function, for `torch.compile`: a single new pair
        ([1, h] state, [1] token, [1] position) after `keys`/`values` ([kv heads, T, d]); returns
        (state [1, h], keys, values) with the pair appended. Same arithmetic as `step`."""
        x, q, k, v = self._project(features, tokens, positions)
        keys, values = torch.cat([keys, k], dim=1), torch.cat([values, v], dim=1)
        attended = F.scaled_dot_product_attention(q, self._expand_kv(keys), self._expand_kv(values))
        return self._finish(x, attended), keys, values

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


class DraftHead(PairHead):
    def __init__(self, config: HeadConfig, vocab_ids: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        h, inner = config.hidden_size, config.intermediate_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.attn_norm = RMSNorm(h, config.rms_eps)
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, h, bias=False)
        self.v_proj = nn.Linear(h, h, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)
        self.mlp_norm = RMSNorm(h, config.rms_eps)
        self.gate_proj = nn.Linear(h, inner, bias=False)
        self.up_proj = nn.Linear(h, inner, bias=False)
        self.down_proj = nn.Linear(inner, h, bias=False)
        self.final_norm = RMSNorm(h, config.rms_eps)
        self.register_buffer("vocab_ids", vocab_ids.to(torch.long), persistent=True)
        self.head_dim, self.num_heads = config.head_dim, config.num_heads
        self.num_kv_heads = config.num_heads
        # borrowed from the target by attach(); never trained, never saved
        self.embed: nn.Module | None = None
        self.lm_rows: torch.Tensor | None = None
        self.source: str | None = None  # the file it was loaded from

    @property
    def feature_width(self) -> int:
        return self.config.hidden_size

    @property
    def target_vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def target_name(self) -> str:
        return self.config.target

    def feature_layers_for(self, target_model: nn.Module) -> tuple[int, ...]:
        return (-1,)  # the target's final normed state, what its LM head reads

    # ------------------------------------------------------------------ target coupling
    def attach(self, target_model: nn.Module) -> "DraftHead":
        """Borrow the target's input embeddings and the subset's rows of its LM head."""
        # plain attribute, not a submodule: the target's embeddings are neither trained nor saved
        object.__setattr__(self, "embed", target_model.get_input_embeddings())
        weight = target_model.get_output_embeddings().weight
        self.lm_rows = weight.detach()[self.vocab_ids.to(weight.device)].to(self.fc.weight.device, self.fc.weight.dtype)
        return self

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Scores over the subset [..., S]; `vocab_ids` maps an index back to a token id."""
        return features @ self.lm_rows.T

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens.to(self.embed.weight.device)).to(self.fc.weight.device, self.fc.weight.dtype)

    # ------------------------------------------------------------------ the layer
    def _project(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor):
        """Pairs -> (residual stream, q, k, v) with RoPE at `positions`. Shapes [..., T, *]."""
        x = self.fc(torch.cat([self.embed_tokens(tokens), features.to(self.fc.weight.dtype)], dim=-1))
        normed = self.attn_norm(x)
        shape = normed.shape[:-1] + (self.config.num_heads, self.config.head_dim)
        q, k, v = (proj(normed).view(shape).transpose(-3, -2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return x, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Attention output [..., heads, T, d] -> predicted feature [..., T, H]."""
        x = x + self.o_proj(attended.transpose(-3, -2).flatten(-2))
        normed = self.mlp_norm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(normed)) * self.up_proj(normed))
        return self.final_norm(x)

    # ------------------------------------------------------------------ files
    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        tensors = {name: (t.to(torch.float16) if t.is_floating_point() else t).contiguous().cpu()
                   for name, t in self.state_dict().items()}
        metadata = {"format": FORMAT, "config": json.dumps(asdict(self.config))}
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        save_file(tensors, str(temporary), metadata=metadata)
        temporary.replace(path)

    @classmethod
    def load(cls, path: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> "DraftHead":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        except (OSError, SafetensorError) as exc:
            raise UserError(f"cannot read draft head {path}: {exc}") from None
        fields = config_fields(metadata)
        if fields is None or "vocab_ids" not in tensors:
            raise UserError(f"{path} is not a mars draft head ({FORMAT})")
        config = HeadConfig(**fields)
        head = cls(config, tensors["vocab_ids"])
        head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()})
        return head.to(device=device, dtype=dtype).eval()
