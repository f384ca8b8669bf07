"""The EAGLE-3 draft head, in the public checkpoint format that vLLM (`Eagle3LlamaForCausalLM`) and
SGLang (`LlamaForCausalLMEagle3`) load, read and written.

A head directory holds `config.json` and `model.safetensors` (a pickled `pytorch_model.bin` only
with --allow-pickle). The head reads three of the target's hidden states at once, low, middle and
high (`hidden_states[2]`, `[N // 2]` and `[N - 3]` of an N-layer target: the inputs of those
layers), concatenated [3H], and mixes them with `fc` into its own width h. Its one decoder layer
attends over cat(input_layernorm(embed(token)), hidden_norm(state)) [2h]; its output before the
final norm is the state it feeds back at the next drafting step (where `fc` is skipped: the state
already has width h). `norm` then `lm_head` score a draft vocabulary of `draft_vocab_size` tokens;
draft row i is target token `i + d2t[i]`; `t2d` marks the target tokens in it. The embedding is
the target's own (an `embed_tokens` tensor in the file is ignored). RoPE follows the head's own
config: no `rope_theta` means 10000, not the target's.

Our own heads are written in this format too, with what we know of them under a `mars` key of
config.json (target, its fingerprint, the training recipe and held-out figures), which the
other loaders ignore.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .. import models
from ..decoding.acceptance import DraftAcceptance
from ..errors import UserError
from . import validate
from .parts import PairHead, RMSNorm

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PICKLE_FILE = "pytorch_model.bin"
IGNORED_KEYS = ("embed_tokens.weight",)
# config.json keys read into Eagle3Config's own fields (the rest is kept as `extra`)
KNOWN_FIELDS = frozenset({"hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                          "vocab_size", "draft_vocab_size", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
                          "max_position_embeddings", "target_hidden_size", "norm_before_residual", "mars"})


@dataclass
class Eagle3Config:
    """The fields of an EAGLE-3 head's config.json that shape it (the rest is kept as `extra`)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    target_hidden_size: int | None = None  # the target's H when it differs from hidden_size
    aux_layer_ids: list[int] | None = None  # eagle_config.eagle_aux_hidden_state_layer_ids
    norm_before_residual: bool = False
    mars: dict = field(default_factory=dict)  # ours: target, fingerprint, recipe, acceptance
    acceptance: DraftAcceptance | None = None  # mars.acceptance, parsed (written back through `mars`)
    extra: dict = field(default_factory=dict)  # any other config.json keys, kept on a round trip

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @classmethod
    def from_json(cls, data: dict, where: str) -> "Eagle3Config":
        """Parse config.json as a schema would: every field's type and range (`where` names the
        file in each refusal); a missing or malformed field is a one-line `UserError`."""
        layers = data.get("num_hidden_layers", 1)
        if not validate.is_int(layers) or layers != 1:
            raise UserError(f"{where}: an EAGLE-3 head has one decoder layer, `num_hidden_layers` is {layers!r:.60}")
        activation = data.get("hidden_act", "silu")
        if activation != "silu":
            raise UserError(f"{where}: only silu heads are supported, `hidden_act` is {activation!r:.60}")
        eagle = validate.optional_dict(data, "eagle_config", where)
        aux = eagle.get("eagle_aux_hidden_state_layer_ids")
        if aux is not None and (not isinstance(aux, list) or len(aux) != 3
                                or not all(validate.is_int(i) and i >= 0 for i in aux)):
            raise UserError(f"{where}: `eagle_aux_hidden_state_layer_ids` must be three layer ids, got {aux!r:.60}")
        rope_theta = data.get("rope_theta")
        if rope_theta is None:
            rope_theta = validate.optional_dict(data, "rope_parameters", where).get("rope_theta")
        mars = validate.optional_dict(data, "mars", where)
        for name in ("target", "target_fingerprint"):
            validate.optional_str(mars, name, f"{where}: `mars`")
        acceptance = (None if mars.get("acceptance") is None else
                      DraftAcceptance.from_json(mars["acceptance"], f"{where}: `mars.acceptance`", where))
        heads = validate.positive_int(data, "num_attention_heads", where)
        vocab = validate.positive_int(data, "vocab_size", where)
        config = cls(
            hidden_size=validate.positive_int(data, "hidden_size", where),
            intermediate_size=validate.positive_int(data, "intermediate_size", where),
            num_attention_heads=heads,
            num_key_value_heads=validate.positive_int(data, "num_key_value_heads", where, heads),
            vocab_size=vocab, draft_vocab_size=validate.positive_int(data, "draft_vocab_size", where, vocab),
            head_dim=validate.positive_int(data, "head_dim", where, None),
            rms_norm_eps=validate.positive_number(data, "rms_norm_eps", where, 1e-6),
            rope_theta=validate.positive_number({"rope_theta": rope_theta}, "rope_theta", where, 10000.0),
            rope_scaling=validate.rope_scaling(data, where),
            max_position_embeddings=validate.positive_int(data, "max_position_embeddings", where, 2048),
            target_hidden_size=validate.positive_int(data, "target_hidden_size", where, None),
            aux_layer_ids=aux,
            norm_before_residual=validate.boolean(data, "norm_before_residual", where, False),
            mars=dict(mars),
            acceptance=acceptance,
            extra={k: v for k, v in data.items() if k not in KNOWN_FIELDS},
        )
        config.check_consistent(where)
        return config

    def check_consistent(self, where: str) -> None:
        """What no single field shows: the attention's geometry and the draft vocabulary's size."""
        if self.draft_vocab_size > self.vocab_size:
            raise UserError(f"{where}: `draft_vocab_size` {self.draft_vocab_size} is larger than `vocab_size` "
                            f"{self.vocab_size} (the draft vocabulary is a subset of the target's)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise UserError(f"{where}: `num_attention_heads` {self.num_attention_heads} is not a multiple of "
                            f"`num_key_value_heads` {self.num_key_value_heads}")
        d = self.attention_head_dim
        if d < 2 or d % 2:
            field_name = "head_dim" if self.head_dim else "hidden_size / num_attention_heads"
            raise UserError(f"{where}: `{field_name}` gives a head dimension of {d}; RoPE needs an even one >= 2")

    def tensor_shapes(self, target_hidden_size: int | None = None) -> dict[str, tuple[int, ...]]:
        """The shape of every tensor of the head this config describes (the checkpoint's keys),
        computed without building it: checked against the file's header before allocating."""
        h, inner, d = self.hidden_size, self.intermediate_size, self.attention_head_dim
        target_hidden = target_hidden_size or self.target_hidden_size or h
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        layer = "midlayer."
        return {
            "fc.weight": (h, 3 * target_hidden),
            layer + "self_attn.q_proj.weight": (q, 2 * h), layer + "self_attn.k_proj.weight": (kv, 2 * h),
            layer + "self_attn.v_proj.weight": (kv, 2 * h), layer + "self_attn.o_proj.weight": (h, q),
            layer + "mlp.gate_proj.weight": (inner, h), layer + "mlp.up_proj.weight": (inner, h),
            layer + "mlp.down_proj.weight": (h, inner),
            layer + "input_layernorm.weight": (h,), layer + "hidden_norm.weight": (h,),
            layer + "post_attention_layernorm.weight": (h,), "norm.weight": (h,),
            "lm_head.weight": (self.draft_vocab_size, h),
            "d2t": (self.draft_vocab_size,), "t2d": (self.vocab_size,),
        }

    def size_fields(self) -> dict[str, int]:
        """The fields that size the head beyond the target's own widths (named when it is too big)."""
        return {"intermediate_size": self.intermediate_size, "draft_vocab_size": self.draft_vocab_size,
                "head_dim": self.attention_head_dim, "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads, "hidden_size": self.hidden_size}

    def to_json(self) -> dict:
        data = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **self.extra,
                "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
                "num_hidden_layers": 1, "hidden_act": "silu", "vocab_size": self.vocab_size,
                "draft_vocab_size": self.draft_vocab_size, "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling,
                "max_position_embeddings": self.max_position_embeddings,
                "norm_before_residual": self.norm_before_residual, "tie_word_embeddings": False}
        if self.head_dim is not None:
            data["head_dim"] = self.head_dim
        if self.target_hidden_size is not None:
            data["target_hidden_size"] = self.target_hidden_size
        if self.aux_layer_ids is not None:
            data["eagle_config"] = {**(data.get("eagle_config") or {}),
                                    "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)}
        if self.mars:
            data["mars"] = self.mars
        return data


class _Attention(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        width, d = 2 * config.hidden_size, config.attention_head_dim
        self.q_proj = nn.Linear(width, config.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(width, config.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(width, config.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * d, config.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    """The decoder layer, named as in the public checkpoints (`midlayer.*`)."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.self_attn = _Attention(config)
        self.mlp = _MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


def rope_frequencies(config: Eagle3Config) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [d / 2], attention scaling) for the head's own RoPE settings, through
    transformers' RoPE initialisers (so scaled variants such as Llama 3's behave as in vLLM)."""
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    options = {"rope_theta": config.rope_theta}
    if config.rope_scaling:
        options["rope_scaling"] = dict(config.rope_scaling)
    llama = transformers.LlamaConfig(hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
                                     head_dim=config.attention_head_dim,
                                     max_position_embeddings=config.max_position_embeddings, **options)
    rotary = LlamaRotaryEmbedding(llama)
    return rotary.inv_freq.float().clone(), float(rotary.attention_scaling)


class Eagle3Head(PairHead):
    """An EAGLE-3 head; parameter names are the public checkpoint's keys."""

    def __init__(self, config: Eagle3Config, target_hidden_size: int | None = None) -> None:
        super().__init__()
        self.config = config
        target_hidden = target_hidden_size or config.target_hidden_size or config.hidden_size
        self.fc = nn.Linear(3 * target_hidden, config.hidden_size, bias=False)
        self.midlayer = _MidLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        # float32 whatever the head's dtype (not a buffer, so .to(dtype) leaves it alone)
        self.inv_freq, self.rope_scale = rope_frequencies(config)
        self.head_dim = config.attention_head_dim
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.aux_layers: tuple[int, ...] | None = None

    # ------------------------------------------------------------------ identity
    @property
    def vocab_ids(self) -> torch.Tensor:  # type: ignore[override]
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    @property
    def feature_width(self) -> int:
        return self.fc.in_features

    @property
    def target_vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def target_name(self) -> str:
        return str(self.config.mars.get("target", ""))

    @property
    def acceptance(self) -> DraftAcceptance | None:
        return self.config.acceptance

    def feature_layers_for(self, target_model: nn.Module) -> tuple[int, ...]:
        """hidden_states entries: the configured aux layer ids + 1 (the outputs of those layers),
        else 2, N // 2 and N - 3 of an N-layer target (the inputs of those layers)."""
        if self.config.aux_layer_ids is not None:
            return tuple(i + 1 for i in self.config.aux_layer_ids)
        return default_aux_layers(models.num_layers(target_model))

    def set_vocabulary(self, draft_to_target: torch.Tensor) -> None:
        """The draft vocabulary as target ids in draft-row order: fills d2t and t2d."""
        ids = draft_to_target.to(torch.long).to(self.d2t.device)
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def attach(self, target_model: nn.Module) -> "Eagle3Head":
        """Borrow the target's input embeddings and note which of its layers to read."""
        super().attach(target_model)
        self.aux_layers = self.feature_layers_for(target_model)
        return self

    # ------------------------------------------------------------------ the layer
    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """Scores over the draft vocabulary; row i is target token `vocab_ids[i]`."""
        return self.lm_head(self.norm(state))

    def _inverse_frequencies(self, device: torch.device) -> torch.Tensor:
        return self.inv_freq.to(device)

    def _project(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor):
        layer = self.midlayer
        state = features.to(self.fc.weight.dtype)
        if state.shape[-1] != self.config.hidden_size:  # the target's fused features; fed-back states are h wide
            state = self.fc(state)
        normed_state = layer.hidden_norm(state)
        residual = normed_state if self.config.norm_before_residual else state
        stacked = torch.cat([layer.input_layernorm(self.embed_tokens(tokens)), normed_state], dim=-1)
        attention = layer.self_attn
        q, k, v = self._attention_inputs(stacked, (attention.q_proj, attention.k_proj, attention.v_proj), positions)
        return residual, q, k, v

    def _finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        layer = self.midlayer
        x = x + layer.self_attn.o_proj(attended.transpose(-3, -2).flatten(-2))
        return x + layer.mlp(layer.post_attention_layernorm(x))  # before `norm`: what is fed back

    # ------------------------------------------------------------------ files
    def save_pretrained(self, directory: Path) -> None:
        """config.json and model.safetensors (fp16), written to a temporary folder then renamed."""
        from ..paths import write_atomic

        # the weights first: non-finite ones are refused before anything is written
        self._save_weights(directory / WEIGHTS_FILE, {"format": "pt"}, head=directory)
        write_atomic(directory / CONFIG_FILE, json.dumps(self.config.to_json(), indent=2) + "\n")

    @classmethod
    def read_config(cls, directory: Path) -> Eagle3Config:
        """A head directory's config.json, read and checked field by field (nothing else is read)."""
        path = directory / CONFIG_FILE
        try:
            data = validate.read_json_object(path)
        except FileNotFoundError:
            try:
                empty = not any(directory.iterdir())
            except OSError:
                empty = False
            raise UserError(f"{directory}{' is empty' if empty else f': no {CONFIG_FILE}'} (an EAGLE-3 head "
                            f"directory holds {CONFIG_FILE} and {WEIGHTS_FILE})") from None
        return Eagle3Config.from_json(data, str(path))

    @classmethod
    def load(cls, directory: Path, allow_pickle: bool = False, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32, check: Callable[[Eagle3Config, int], None] | None = None,
             max_parameters: int | None = None) -> "Eagle3Head":
        """Read a head directory. All is checked before the module is allocated, so a lying file
        costs nothing: config.json field by field, then the tensors' names, shapes and dtypes
        and its size against `max_parameters` (default: what memory holds), the tensors' names,
        shapes and dtypes from the safetensors header against it, `check(config, target hidden
        size)` (the caller's checks against its target), the RoPE settings; d2t's values once
        read. Each refusal is a `UserError`."""
        where = str(directory)
        config = cls.read_config(directory)
        infos, read_tensors = weight_headers(directory, allow_pickle)
        fc = infos.get("fc.weight")
        if fc is None or len(fc.shape) != 2 or fc.shape[1] % 3 or not fc.shape[1]:
            raise UserError(f"{where}: `fc.weight` must be [hidden, 3 x target hidden], "
                            f"got {None if fc is None else list(fc.shape)}")
        target_hidden = fc.shape[1] // 3
        shapes = config.tensor_shapes(target_hidden)
        limit = max_parameters or validate.parameter_limit(None)
        validate.check_size(shapes, config.size_fields(), f"{where}/{CONFIG_FILE}", limit)
        optional = frozenset({"t2d"}) if "d2t" in infos else frozenset()
        validate.compare_shapes(infos, shapes, where, "an EAGLE-3 head", optional, IGNORED_KEYS)
        used = {name: info for name, info in infos.items() if name not in IGNORED_KEYS}
        validate.check_dtypes(used, integer=("d2t",), flags=("t2d",), where=where)
        if check is not None:
            check(config, target_hidden)
        validate.check_rope(lambda: rope_frequencies(config), f"{where}/{CONFIG_FILE}")
        tensors = read_tensors()
        d2t = tensors["d2t"].to(torch.long)
        target_ids = d2t + torch.arange(d2t.numel())
        if int(target_ids.min()) < 0 or int(target_ids.max()) >= config.vocab_size:
            raise UserError(f"{where}: d2t maps draft tokens outside the target vocabulary (0..{config.vocab_size - 1})")
        if target_ids.unique().numel() != target_ids.numel():
            raise UserError(f"{where}: d2t maps two draft tokens to the same target token")
        head = cls(config, target_hidden_size=target_hidden)
        state = {k: (v.float() if v.is_floating_point() else v) for k, v in tensors.items() if k in shapes}
        state["d2t"] = d2t
        head.load_state_dict(state, strict=False)
        head.set_vocabulary(target_ids)  # t2d rebuilt from d2t: the two always agree
        head.source = where
        return head.to(device=device, dtype=dtype).eval()


def weight_headers(directory: Path, allow_pickle: bool) -> tuple[dict[str, validate.TensorInfo],
                                                                  Callable[[], dict[str, torch.Tensor]]]:
    """What model.safetensors holds (from its header: nothing is read yet) and how to read it;
    or pytorch_model.bin with --allow-pickle (weights only, read at once: a pickle has no header)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    safetensors_path, pickle_path = directory / WEIGHTS_FILE, directory / PICKLE_FILE
    if validate.regular_file(safetensors_path):
        infos, _ = validate.header_tensors(safetensors_path)

        def read() -> dict[str, torch.Tensor]:
            try:
                return load_file(str(safetensors_path))
            except (OSError, SafetensorError) as error:
                raise UserError(f"cannot read {safetensors_path}: {validate.first_line(error)}") from None

        return infos, read
    if validate.regular_file(pickle_path):
        if not allow_pickle:
            raise UserError(f"{pickle_path} is a pickle file, which can run code when loaded; "
                            "pass --allow-pickle if you trust it")
        try:
            tensors = torch.load(pickle_path, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - any unpickling failure means the same to the user
            raise UserError(f"cannot read {pickle_path}: {validate.first_line(error)}") from None
        if not isinstance(tensors, dict):
            raise UserError(f"{pickle_path} does not hold a dictionary of tensors")
        infos = validate.tensor_infos(tensors, str(pickle_path))
        return infos, lambda: tensors
    raise UserError(f"{directory}: no {WEIGHTS_FILE} (or {PICKLE_FILE})")


def default_aux_layers(layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high features of an N-layer target, as hidden_states indices."""
    return (2, layers // 2, layers - 3)


def is_head_directory(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG_FILE).is_file()
