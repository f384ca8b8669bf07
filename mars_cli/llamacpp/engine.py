"""llama.cpp as a forward: a GGUF model and one context, through llama-cpp-python's low-level API.

What speculative decoding needs of it, and nothing else:
- `decode`: a batch of tokens, each with its position, the set of sequences it belongs to and
  whether its logits are wanted; returns those logits ([rows, V] float32, in batch order);
- `remove` and `copy`: a sequence's cache cells, for rollback and for keeping the accepted path.
The context's cache is unified (`kv_unified`): a cell may belong to several sequences, which is
how a draft tree's shared prefix is one cell for all its branches. Tokens are ids: tokenizing
and chat templates stay with the Hugging Face tokenizer, as on the transformers engine.

`llama_cpp` is imported when an engine is built, never at import time: the main environment has
no binding (`make setup-llamacpp` builds it in `.venv-llamacpp`).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import UserError

BINDING_MISSING = ("--engine llama.cpp needs llama-cpp-python, which builds llama.cpp from source: run `make "
                   "setup-llamacpp` (a C/C++ compiler and cmake) and use .venv-llamacpp/bin/mars")


def binding():
    """The `llama_cpp` module, or a one-line UserError saying how to get it."""
    try:
        import llama_cpp
    except ImportError:
        raise UserError(BINDING_MISSING) from None
    return llama_cpp


@dataclass(frozen=True)
class EngineSettings:
    """How the context is built: its length, threads, the most tokens one decode takes (a
    verification's width), and how many sequences a tree may use at once."""

    context: int = 4096
    threads: int = 0  # 0: the cores this process may run on
    batch: int = 512  # tokens a prefill feeds per decode
    sequences: int = 65  # a tree of 64 nodes has at most 64 leaves, plus the committed sequence

    def thread_count(self) -> int:
        return self.threads or len(os.sched_getaffinity(0))


class LlamaEngine:
    """One GGUF model and one context over it; decodes batches and edits the cache's sequences."""

    def __init__(self, path: str | Path, settings: EngineSettings = EngineSettings()) -> None:
        lib = self.lib = binding()
        lib.llama_backend_init()
        if not os.environ.get("MARS_LLAMA_LOG"):  # llama.cpp's loading chatter off stderr unless asked for
            lib.llama_log_set(_silencer(), ctypes.c_void_p(0))
        model_params = lib.llama_model_default_params()
        self.model = lib.llama_model_load_from_file(str(path).encode(), model_params)
        if not self.model:
            raise UserError(f"llama.cpp could not load {path} (not a GGUF model it knows?)")
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.vocab_size = lib.llama_vocab_n_tokens(self.vocab)
        self.trained_context = lib.llama_model_n_ctx_train(self.model)
        params = lib.llama_context_default_params()
        params.n_ctx = min(settings.context, self.trained_context) if self.trained_context > 0 else settings.context
        # A batch and a sequence count no larger than the context: 512 tokens and 65 sequences on a
        # file trained on 64 positions aborted the process in llama.cpp's n_outputs_max assertion.
        # The loop never feeds more rows, nor a tree with more leaves, than the window has room for;
        # prefills chunk by settings.batch.
        settings = dataclasses.replace(settings, batch=max(1, min(settings.batch, params.n_ctx)),
                                       sequences=max(1, min(settings.sequences, params.n_ctx)))
        self.settings = settings
        params.n_batch = params.n_ubatch = settings.batch
        params.n_seq_max = settings.sequences
        params.kv_unified = True  # one cell, several sequences: a tree's shared prefix
        params.n_threads = params.n_threads_batch = settings.thread_count()
        params.no_perf = True
        self.context = lib.llama_init_from_model(self.model, params)
        if not self.context:
            raise UserError(f"llama.cpp could not make a context of {params.n_ctx} positions for {path}")
        self.length = lib.llama_n_ctx(self.context)
        self.memory = lib.llama_get_memory(self.context)
        self._batch = lib.llama_batch_init(settings.batch, 0, settings.sequences)
        self._capacity = settings.batch

    def set_threads(self, threads: int) -> None:
        self.lib.llama_set_n_threads(self.context, threads, threads)

    def decode(self, tokens: Sequence[int], positions: Sequence[int], sequences: Sequence[Sequence[int]],
               wanted: Sequence[bool]) -> np.ndarray:
        """Feed one batch (at most `settings.batch` tokens); the logits of the rows `wanted` marks,
        [rows, V] float32 in batch order (a copy: the next decode overwrites llama.cpp's buffer)."""
        count = len(tokens)
        if count > self._capacity:
            raise ValueError(f"a batch of {count} tokens is wider than the engine's {self._capacity}")
        batch = self._batch
        batch.n_tokens = count
        for row, (token, position, members, logits) in enumerate(zip(tokens, positions, sequences, wanted)):
            batch.token[row] = token
            batch.pos[row] = position
            batch.n_seq_id[row] = len(members)
            for slot, member in enumerate(members):
                batch.seq_id[row][slot] = member
            batch.logits[row] = logits
        status = self.lib.llama_decode(self.context, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status} for a batch of {count} tokens")
        rows = sum(1 for logits in wanted if logits)
        if rows == 0:
            return np.empty((0, self.vocab_size), dtype=np.float32)
        pointer = self.lib.llama_get_logits(self.context)
        return np.ctypeslib.as_array(pointer, shape=(rows, self.vocab_size)).copy()

    def remove(self, sequence: int, start: int = -1, end: int = -1) -> None:
        """Drop `sequence` from the cells at positions [start, end) (-1: open); a cell left in no
        sequence is free."""
        self.lib.llama_memory_seq_rm(self.memory, sequence, start, end)

    def copy(self, source: int, destination: int, start: int = -1, end: int = -1) -> None:
        """Add `destination` to the sequences of `source`'s cells at [start, end): no data moves."""
        self.lib.llama_memory_seq_cp(self.memory, source, destination, start, end)

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.memory, True)

    def close(self) -> None:
        if getattr(self, "context", None):
            self.lib.llama_batch_free(self._batch)
            self.lib.llama_free(self.context)
            self.context = None
        if getattr(self, "model", None):
            self.lib.llama_model_free(self.model)
            self.model = None

    def __del__(self) -> None:  # pragma: no cover - at interpreter exit the binding may be gone
        with contextlib.suppress(Exception):
            self.close()


@functools.cache
def _silencer():
    """A llama.cpp log callback that drops every line (kept alive here: llama.cpp holds its pointer)."""
    return binding().llama_log_callback(lambda level, text, user_data: None)
