"""A target on llama.cpp: the GGUF file run at its own precision, and what the decoding loop and
the session read of a target (tokenizer, end-of-sequence ids, vocabulary, context window,
fingerprint), as models.LoadedModel offers them on the transformers engine.

The tokenizer is the Hugging Face one of the same GGUF (the directory `mars` converts it into once,
models.gguf_cache_entry), so chat templates and token ids are the transformers engine's. The
fingerprint is that directory's (models.file_fingerprint), so profiles found for the model on
one engine are found on the other.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import require
from .engine import EngineSettings, LlamaEngine

ENGINE = "llama.cpp"


@dataclass
class LlamaTarget:
    """The target as the loop sees it; `engine` runs its forwards."""

    spec: str
    source: str  # the GGUF file
    engine: LlamaEngine
    tokenizer: object
    converted: Path  # the Hugging Face directory of the same GGUF: tokenizer, config, fingerprint
    file_type: str  # the GGUF's weight type, e.g. "Q4_1": what "dtype" means on this engine
    _fingerprint: str | None = None
    dtype_choice: object = None  # no --dtype auto measurement: the file's own precision
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def output_device(self) -> torch.device:
        return self.device

    @property
    def dtype(self) -> str:
        return f"gguf-{self.file_type.lower()}"

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def context_window(self) -> int:
        return self.engine.length

    @property
    def eos_token_ids(self) -> set[int]:
        lib, vocab = self.engine.lib, self.engine.vocab
        ids = {int(lib.llama_vocab_eos(vocab)), int(lib.llama_vocab_eot(vocab))}
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        return {token for token in ids if token >= 0}

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            from ..models import file_fingerprint

            self._fingerprint = file_fingerprint(self.converted)
        return self._fingerprint


def gguf_file(spec: str) -> Path:
    """The GGUF file a model spec names: an embedded model's, or a .gguf path."""
    from ..models import resolve_spec

    location, name = resolve_spec(spec)
    require(name is not None, f"--engine llama.cpp runs GGUF files: {spec} is not one (name an embedded model or a "
                              ".gguf file, or use the default engine)")
    return Path(location)


def load_target(spec: str, settings: EngineSettings = EngineSettings()) -> LlamaTarget:
    """The GGUF named by `spec` on llama.cpp, with its tokenizer."""
    from transformers import AutoTokenizer

    from ..models import gguf_cache_entry

    path = gguf_file(spec)
    converted = gguf_cache_entry(path)
    tokenizer = AutoTokenizer.from_pretrained(converted, local_files_only=True)
    engine = LlamaEngine(path, settings)
    return LlamaTarget(spec, str(path), engine, tokenizer, converted, file_type(engine))


def file_type(engine: LlamaEngine) -> str:
    """The model's weight type as llama.cpp describes it ("Q4_1", "F16", ...)."""
    buffer = ctypes.create_string_buffer(256)
    engine.lib.llama_model_desc(engine.model, buffer, 256)
    words = buffer.value.decode(errors="replace").split(maxsplit=2)  # "llama 135M Q4_1", "gemma3 270M Q4_K - Medium"
    return words[2].replace(" - ", "_").replace(" ", "_") if len(words) == 3 else "unknown"
