"""A loaded causal LM with where it came from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .facts import hidden_size, num_layers, rope_theta, text_config, vocab_size

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass
class LoadedModel:
    """A causal LM ready for decoding, with where it came from."""

    spec: str
    source: str  # the file or directory (or repo id) it was loaded from
    model: torch.nn.Module
    tokenizer: object
    device: torch.device  # where inputs go (the input embeddings' device)
    dtype: torch.dtype
    _fingerprint: str | None = None
    dtype_choice: Any = None  # `--dtype auto`'s measurement (tuning/dtype.py), attached by the tuning layer
    directory: Path | None = None  # the local directory its weights were read from (its fingerprint is remembered)
    converted_copies: Path | None = None  # a GGUF cache entry's folder of its weights in other dtypes
    linears: str = "dense"  # "q4": its linears run on their codes (decoding/quantized.py), the weights stay float32

    @property
    def precision(self) -> str:
        """What `--dtype` its forwards run at: a dtype's name, or q4."""
        return self.linears if self.linears != "dense" else str(self.dtype).replace("torch.", "")

    @property
    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for value in (
            getattr(self.model.generation_config, "eos_token_id", None),
            getattr(self.tokenizer, "eos_token_id", None),
        ):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    @property
    def output_device(self) -> torch.device:
        """Where logits land (differs from `device` when device_map splits the model)."""
        return self.model.get_output_embeddings().weight.device

    @property
    def fingerprint(self) -> str:
        """Identity of weights + tokenizer, the same whatever the file format or device."""
        if self._fingerprint is None:
            from .fingerprint import loaded_fingerprint

            self._fingerprint = loaded_fingerprint(self)
        return self._fingerprint

    @property
    def text_config(self) -> "PretrainedConfig":
        return text_config(self.model)

    @property
    def hidden_size(self) -> int:
        return hidden_size(self.model)

    @property
    def num_layers(self) -> int:
        return num_layers(self.model)

    @property
    def rope_theta(self) -> float:
        return rope_theta(self.model)

    @property
    def vocab_size(self) -> int:
        return vocab_size(self.model)

    @property
    def context_window(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)
