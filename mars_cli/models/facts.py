"""Model facts, one lookup each, for code that holds a bare module; LoadedModel's properties of
the same names read them through these."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig


# One lookup each, for code that holds a bare module; LoadedModel's properties of the same names
# read them through these.
def text_config(model: torch.nn.Module) -> "PretrainedConfig":
    """The language model's config: multimodal models (Gemma 3's) nest it as `text_config`."""
    return getattr(model.config, "text_config", model.config)


def hidden_size(model: torch.nn.Module) -> int:
    """Width of the hidden states (the features draft heads read)."""
    return int(text_config(model).hidden_size)


def num_layers(model: torch.nn.Module) -> int:
    """Decoder layers; `hidden_states` has one entry more (the embeddings come first)."""
    return int(text_config(model).num_hidden_layers)


def rope_theta(model: torch.nn.Module) -> float:
    """RoPE's base: in `rope_parameters` since transformers 5, `rope_theta` before; 10000 if neither."""
    config = text_config(model)
    rope = getattr(config, "rope_parameters", None)
    return float((rope.get("rope_theta") if isinstance(rope, dict) else None) or getattr(config, "rope_theta", 10000.0))


def vocab_size(model: torch.nn.Module) -> int:
    """Rows of the LM head, the width of the logits (may exceed the tokenizer's length: padding)."""
    return int(model.get_output_embeddings().weight.shape[0])
