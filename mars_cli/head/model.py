"""The original single-file draft head (`DraftHead`, EAGLE-1 style). What it shares with the
EAGLE-3 head (eagle3.py), the drafting arithmetic of `PairHead` included, lives in parts.py.

`DraftHead` predicts the target's last hidden state f_{p+1} from the pair (f_p, x_{p+1}); its LM
head is the target's own, cut to a frequency-ranked subset of the vocabulary. Only the small
trainable part is saved (fc, one decoder layer, norms: about 4.6M parameters for SmolLM2-135M);
the embeddings and LM-head rows are borrowed, frozen, from the target at load time. Its file is
safetensors: fp16 weights, the subset's token ids, and a JSON `config` entry in the metadata
(shape, target, training recipe).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .. import models
from ..errors import UserError
from . import validate
from .parts import HeadCache, PairHead, RMSNorm, plain_inverse_frequencies

# HeadCache and PairHead live in parts.py; callers that import them from here keep working
__all__ = ["FORMAT", "DraftHead", "HeadCache", "HeadConfig", "PairHead", "config_fields"]

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
    def from_fields(cls, fields: object, where: str) -> "HeadConfig":
        """The metadata's `config` entry checked as a schema would: a JSON object of known fields,
        each of its type and range (a list, an unknown field or a string size is one line)."""
        if not isinstance(fields, dict):
            raise UserError(f"{where}: must be a JSON object, not {type(fields).__name__}")
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise UserError(f"{where}: unknown field `{str(unknown[0]):.40}`"
                            f"{f' (and {len(unknown) - 1} more)' if len(unknown) > 1 else ''}")
        recipe = fields.get("recipe")
        if recipe is not None and not isinstance(recipe, dict):
            raise UserError(f"{where}: `recipe` must be a JSON object, got {type(recipe).__name__}")
        config = cls(hidden_size=validate.positive_int(fields, "hidden_size", where),
                     num_heads=validate.positive_int(fields, "num_heads", where),
                     intermediate_size=validate.positive_int(fields, "intermediate_size", where),
                     vocab_size=validate.positive_int(fields, "vocab_size", where),
                     rope_theta=validate.positive_number(fields, "rope_theta", where, 10000.0),
                     rms_eps=validate.positive_number(fields, "rms_eps", where, 1e-5),
                     target=validate.optional_str(fields, "target", where),
                     target_fingerprint=validate.optional_str(fields, "target_fingerprint", where),
                     recipe=dict(recipe or {}))
        if config.hidden_size % config.num_heads or config.head_dim < 2 or config.head_dim % 2:
            raise UserError(f"{where}: `hidden_size` {config.hidden_size} / `num_heads` {config.num_heads} "
                            "must give an even head dimension >= 2 (RoPE rotates pairs)")
        return config

    def tensor_shapes(self, rows: int) -> dict[str, tuple[int, ...]]:
        """The saved tensors of a head with this config and `rows` vocabulary rows, computed
        without building it: checked against the file's header before allocating."""
        h, inner = self.hidden_size, self.intermediate_size
        return {"fc.weight": (h, 2 * h), "attn_norm.weight": (h,), "q_proj.weight": (h, h), "k_proj.weight": (h, h),
                "v_proj.weight": (h, h), "o_proj.weight": (h, h), "mlp_norm.weight": (h,),
                "gate_proj.weight": (inner, h), "up_proj.weight": (inner, h), "down_proj.weight": (h, inner),
                "final_norm.weight": (h,), "vocab_ids": (rows,)}

    @classmethod
    def for_target(cls, model: nn.Module, **extra) -> "HeadConfig":
        """A head as wide as the target, with its MLP width, RoPE base and norm epsilon."""
        config = models.text_config(model)
        hidden = models.hidden_size(model)
        head_dim = int(getattr(config, "head_dim", None) or 64)
        num_heads = max(1, hidden // head_dim) if hidden % head_dim == 0 else 1
        return cls(hidden_size=hidden, num_heads=num_heads,
                   intermediate_size=int(getattr(config, "intermediate_size", 4 * hidden)),
                   vocab_size=models.vocab_size(model), rope_theta=models.rope_theta(model),
                   rms_eps=float(getattr(config, "rms_norm_eps", 1e-5)), **extra)


def config_fields(metadata: dict | None) -> dict | None:
    """The HeadConfig fields stored in a safetensors file's metadata; None if not a head."""
    if not metadata or metadata.get("format") != FORMAT or "config" not in metadata:
        return None
    try:
        return json.loads(metadata["config"])
    except (ValueError, RecursionError):  # not JSON, or nested too deep to be a config
        return None


class DraftHead(PairHead):
    """The EAGLE-1 style head; see the module docstring."""

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
        self.lm_rows: torch.Tensor | None = None  # the target's, borrowed by attach(); never saved

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
        super().attach(target_model)
        weight = target_model.get_output_embeddings().weight
        self.lm_rows = weight.detach()[self.vocab_ids.to(weight.device)].to(self.fc.weight.device, self.fc.weight.dtype)
        return self

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Scores over the subset [..., S]; `vocab_ids` maps an index back to a token id."""
        return features @ self.lm_rows.T

    # ------------------------------------------------------------------ the layer
    def _inverse_frequencies(self, device: torch.device) -> torch.Tensor:
        return plain_inverse_frequencies(self.head_dim, self.config.rope_theta, device)

    def _project(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor):
        """Pairs -> (residual stream, q, k, v) with RoPE at `positions`. Shapes [..., T, *]."""
        x = self.fc(torch.cat([self.embed_tokens(tokens), features.to(self.fc.weight.dtype)], dim=-1))
        q, k, v = self._attention_inputs(self.attn_norm(x), (self.q_proj, self.k_proj, self.v_proj), positions)
        return x, q, k, v

    def _finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Attention output [..., heads, T, d] -> predicted feature [..., T, H]."""
        x = x + self.o_proj(attended.transpose(-3, -2).flatten(-2))
        normed = self.mlp_norm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(normed)) * self.up_proj(normed))
        return self.final_norm(x)

    # ------------------------------------------------------------------ files
    def save(self, path: Path) -> None:
        """One .safetensors file: fp16 weights, `vocab_ids`, the config as JSON in the metadata."""
        self._save_weights(path, {"format": FORMAT, "config": json.dumps(asdict(self.config))})

    @classmethod
    def load(cls, path: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
             check: Callable[[HeadConfig], None] | None = None, max_parameters: int | None = None) -> "DraftHead":
        """Read a single-file head. All is checked before the module is allocated: the metadata's
        config field by field, its size against `max_parameters` (default: what memory holds), the
        tensors' names, shapes and dtypes from the header, `check(config)` (the caller's checks
        against its target); the vocabulary ids once read. Each refusal is a `UserError`."""
        from safetensors import SafetensorError, safe_open

        where = str(path)
        infos, metadata = validate.header_tensors(path)
        fields = config_fields(metadata)
        if fields is None or "vocab_ids" not in infos:
            raise UserError(f"{path} is not a mars draft head ({FORMAT})")
        config = HeadConfig.from_fields(fields, f"{where}: metadata `config`")
        rows = infos["vocab_ids"].shape
        if len(rows) != 1 or not rows[0] or rows[0] > config.vocab_size:
            raise UserError(f"{where}: `vocab_ids` has shape {list(rows)}; it lists at most `vocab_size` "
                            f"({config.vocab_size}) token ids")
        shapes = config.tensor_shapes(rows[0])
        fields_sizes = {"intermediate_size": config.intermediate_size, "hidden_size": config.hidden_size}
        validate.check_size(shapes, fields_sizes, where, max_parameters or validate.parameter_limit(None))
        validate.compare_shapes(infos, shapes, where, f"a mars draft head ({FORMAT})")
        validate.check_dtypes(infos, integer=("vocab_ids",), where=where)
        if check is not None:
            check(config)
        try:
            with safe_open(str(path), framework="pt") as handle:
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        except (OSError, SafetensorError) as exc:
            raise UserError(f"cannot read draft head {path}: {exc}") from None
        ids = tensors["vocab_ids"].to(torch.long)
        if int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size:
            raise UserError(f"{where}: `vocab_ids` lists tokens outside the vocabulary (0..{config.vocab_size - 1})")
        head = cls(config, ids)
        head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()})
        return head.to(device=device, dtype=dtype).eval()
