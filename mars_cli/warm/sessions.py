"""The warm server's sessions: a request gets exactly what a fresh process would get.

A session is kept under what it was built from: the working directory and the options that shape
a build. Per-call options (PER_CALL: the token budget, sampling settings, seed, stop strings, raw
prompts) never rebuild one: a request that changes only those decodes on the kept session, or on
one derived from it that shares its loaded models. Beside each session lies the identity of every
file its build and decoding read (reads.py: model files, draft head, calibration profiles, tuning
entries, folders searched); a session one of them changed for is dropped and built again, as a
fresh process would build it. Memory is bounded by the sessions kept: one released is collected,
and its pages handed back to the system.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import json
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from .. import reads
from ..errors import require
from ..options import DecodingOptions

# options a request may change without a build: read when a prompt is decoded (CALL_TIME), or
# by the verifier and drafter, which a derived session makes anew around the same loaded models
PER_CALL = ("max_new_tokens", "stop", "raw", "temperature", "top_p", "top_k", "seed")
CALL_TIME = ("max_new_tokens", "stop", "raw", "seed")  # session.py reads these per prompt only


@dataclass
class Kept:
    """A built session and the identities of what it was built from (reads.Record)."""

    session: object
    inputs: reads.Record


def session_key(cwd: str, options: DecodingOptions) -> str:
    """What a kept session is found by: the folder (relative paths) and the build's options."""
    flat = {name: value for name, value in options.flat().items() if name not in PER_CALL}
    return json.dumps([cwd, flat], sort_keys=True, default=str)


class Sessions:
    """At most `most` kept sessions, the least recently used released first."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.kept: OrderedDict[str, Kept] = OrderedDict()

    def find(self, key: str) -> tuple[Kept | None, list[str]]:
        """The kept session for `key` while every input it read is unchanged, and the inputs
        that changed (its session then released)."""
        kept = self.kept.get(key)
        if kept is None:
            return None, []
        changed = reads.changed(kept.inputs)
        if changed:
            self.drop(key)
            return None, changed
        self.kept.move_to_end(key)
        return kept, []

    def keep(self, key: str, kept: Kept) -> None:
        self.kept[key] = kept
        self.kept.move_to_end(key)
        while len(self.kept) > self.most:
            self.kept.popitem(last=False)
            release_memory()

    def drop(self, key: str) -> None:
        if self.kept.pop(key, None) is not None:
            release_memory()


def release_memory() -> None:
    """Collect what a released session left (its models, caches and reference cycles), then
    hand freed heap pages back to the system (glibc's malloc_trim), so resident memory follows
    the sessions kept instead of the sessions ever built."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim():  # type: ignore[no-untyped-def]
    """glibc's malloc_trim, or None elsewhere (musl, macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def build(options: DecodingOptions, startup: object) -> Kept:
    """A new session for `options` and what its build read."""
    from .. import generation

    with reads.recording(writes=True) as inputs:
        session = generation.build(options, startup)  # type: ignore[arg-type]
        read_outside_hooks(session)
    release_memory()  # what the build dropped (`--engine auto`'s other session, conversions)
    return Kept(session, inputs)


def for_call(kept: Kept, options: DecodingOptions) -> object:
    """The kept session, with this request's per-call options: the same session where only options
    read per prompt differ (and its scorer's cache is not sized by the token budget), else a new
    one around the same loaded target and draft model, as a process building for these options
    would make it. Decodes as its own process would: nothing learnt from earlier prompts."""
    session = kept.session
    wanted = dataclasses.replace(options, model=session.options.model)  # type: ignore[attr-defined]  # its engine
    if _differ(session.options, wanted) <= set(CALL_TIME) and not _static(session):  # type: ignore[attr-defined]
        window = session.target.context_window  # type: ignore[attr-defined]
        require(window is None or wanted.max_new_tokens < window,  # Session's own check, for this budget
                f"--max-new-tokens {wanted.max_new_tokens} is beyond the model's context window ({window})")
        session.options = wanted  # type: ignore[attr-defined]
        session.as_fresh()  # type: ignore[attr-defined]
        return session
    from ..session import Session

    derived = Session(wanted, target=session.target, draft_model=session.draft_model)  # type: ignore[attr-defined]
    derived.engine_choice = session.engine_choice  # type: ignore[attr-defined]
    kept.session = derived
    del session
    release_memory()
    return derived


def _differ(have: DecodingOptions, wanted: DecodingOptions) -> set[str]:
    """The flat names whose values differ."""
    old, new = have.flat(), wanted.flat()
    return {name for name in new if old.get(name) != new[name]}


def _static(session: object) -> bool:
    """Whether the session's target cache is preallocated for its token budget (compiled forwards)."""
    return bool(getattr(getattr(session, "scorer", None), "static", False))


def read_outside_hooks(session: object) -> None:
    """What a build reads that no loader records itself: the draft head's files, the user's head
    folder (`--draft auto` and `--dtype auto` search it) and the files the target and draft model
    name (the llama.cpp engine opens its GGUF itself)."""
    from ..models.loading import resolve_spec
    from ..paths import user_head_dir

    head = getattr(getattr(session, "drafter", None), "head", None)
    source = getattr(head, "source", None)
    if isinstance(source, str):
        reads.read_path(source)
    reads.read_folder(user_head_dir(), depth=2)
    options = session.options  # type: ignore[attr-defined]
    for spec in (options.model.target, options.drafting.draft):
        if spec in ("none", "ngram", "auto", "head") or spec.startswith("head:"):
            continue
        try:
            location, _ = resolve_spec(spec)
        except Exception:  # noqa: BLE001 - a spec loading refused already; nothing to watch
            continue
        if isinstance(location, Path):
            reads.read_path(location)


def as_a_fresh_process() -> None:
    """What a process does once it does again for each request, as the fresh process the request
    stands for would: its measuring budget, its notes said once, the tuning summary's one line."""
    from .. import notes
    from ..tuning import clock, summary

    clock.BUDGET = clock.process_budget()
    notes._SHOWN.clear()  # noqa: SLF001 - notes.py keeps it per process; a request is one here
    summary.STATE.said = False


def kernel_library() -> Path | None:
    """The kernel library this process loaded, if it did (a process cannot load it again: a
    changed one makes the whole server stale)."""
    kernels = sys.modules.get("mars_cli.decoding.kernels")
    torch = sys.modules.get("torch")
    if kernels is None or torch is None:
        return None
    try:
        if not hasattr(torch.ops.mars, "quantized_linear"):
            return None
        library = getattr(kernels, "library", None)
        return Path(library()) if callable(library) else kernels.build_dir() / f"{kernels.NAME}.so"
    except Exception:  # noqa: BLE001 - the kernels module's own layout: nothing to watch then
        return None
