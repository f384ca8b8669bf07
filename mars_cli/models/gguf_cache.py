"""GGUF files dequantised once into a cached Hugging Face directory (safetensors + tokenizer),
keyed by the GGUF file's sha256, because transformers' own GGUF conversion takes 20-50 s per load.
Hashes are remembered by file identity (identity.py): a file is hashed once after it changes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import UserError
from ..notes import note
from ..paths import cache_dir
from . import identity
from .quiet import _quiet_loading

CACHE_FORMAT = 1  # bump when the layout of a converted entry changes


file_sha256 = identity.file_sha256  # read once after each change of the file


def _manifest(directory: Path) -> dict[str, dict[str, object]]:
    return {
        entry.name: {"size": entry.stat().st_size, "sha256": file_sha256(entry)}
        for entry in sorted(directory.iterdir())
        if entry.is_file() and entry.name != "manifest.json"
    }


def cache_entry_is_valid(entry: Path) -> bool:
    """An entry is used only if its manifest exists and every file matches size and hash (each
    file's hash remembered by its identity: a warm start stats the files, it does not read them)."""
    try:
        recorded = json.loads((entry / "manifest.json").read_text())
        return recorded.get("format") == CACHE_FORMAT and recorded["files"] == _manifest(entry)
    except (OSError, ValueError, KeyError):
        return False


def gguf_cache_entry(gguf_path: Path) -> Path:
    """Return a valid converted directory for `gguf_path`, converting (or rebuilding) if needed.

    Conversions of one file are serialised by a lock file beside the entry: a second process
    started at the same time waits, then uses the entry the first one wrote."""
    digest = file_sha256(gguf_path)
    entry = cache_dir() / "models" / f"gguf-{digest[:32]}"
    if cache_entry_is_valid(entry):
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with _entry_lock(entry, wait=True):
        if cache_entry_is_valid(entry):  # converted by another process while we waited
            return entry
        _remove_stale_temporaries(entry)
        if entry.exists():
            note(f"cache entry {entry} is incomplete or corrupt; rebuilding it")
            shutil.rmtree(entry, ignore_errors=True)
        _convert_gguf(gguf_path, digest, entry)
    return entry


class _entry_lock:
    """An exclusive flock on `$MARS_CACHE/locks/<entry>.lock` (kept: unlinking a lock file races
    with its next user). The kernel drops the lock when its holder dies (even by kill -9), so a
    held lock always means a live conversion. Without fcntl (Windows) it does nothing, and a lost
    rename race is settled in _convert_gguf instead."""

    def __init__(self, entry: Path, wait: bool) -> None:
        self.path = entry.parent.parent / "locks" / f"{entry.name}.lock"
        self.wait, self.handle, self.acquired = wait, None, False

    def __enter__(self) -> "_entry_lock":
        """The lock, opened in the user's own locks folder without following a link (a link planted
        there made the open create a file at the link's target)."""
        from ..paths import PlantedLock, locks_dir, open_lock

        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on POSIX
            self.acquired = True
            return self
        if self.path.parent == cache_dir() / "locks":
            locks_dir()  # 0700, this user's
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.handle = os.fdopen(open_lock(self.path), "r+b")
        except PlantedLock as exc:
            raise UserError(f"cannot convert a GGUF file: {exc.strerror}; remove it") from None
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
            self.acquired = True
        except BlockingIOError:
            self.acquired = False
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.close()  # closing releases the lock


def _remove_stale_temporaries(entry: Path) -> None:
    """Delete `*.tmp-*` directories left by killed conversions (called with `entry`'s lock held):
    this entry's are stale by construction; another entry's only when its lock is free, that is
    when no live process is converting it."""
    own = entry.name + ".tmp-"
    for temporary in sorted(entry.parent.glob("*.tmp-*")):
        if not temporary.is_dir():
            continue
        if temporary.name.startswith(own):
            shutil.rmtree(temporary, ignore_errors=True)
            continue
        other = entry.with_name(temporary.name.split(".tmp-")[0])
        with _entry_lock(other, wait=False) as lock:
            if lock.acquired:
                shutil.rmtree(temporary, ignore_errors=True)


def _convert_gguf(gguf_path: Path, digest: str, entry: Path) -> None:
    """Dequantise into a temporary sibling directory, then rename: never a half-written entry."""
    _check_gguf(gguf_path)
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=entry.name + ".tmp-", dir=entry.parent))
    try:
        note(f"converting {gguf_path.name} once (later loads use the cache)")
        _dequantise(gguf_path, staging)
        meta = {"format": CACHE_FORMAT, "source_gguf": str(gguf_path), "gguf_sha256": digest}
        meta["files"] = _manifest(staging)
        (staging / "manifest.json").write_text(json.dumps(meta, indent=1))
        try:
            os.replace(staging, entry)
        except OSError:
            if not cache_entry_is_valid(entry):  # another process won an unlocked race: use its entry
                raise
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _dequantise(gguf_path: Path, staging: Path) -> None:
    """Load the GGUF through transformers (dequantised) and save it as a Hugging Face directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _quiet_loading():
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # The weights are already dequantised; drop the GGUF quantizer marker so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with _quiet_loading():
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)


def _check_gguf(path: Path) -> None:
    """Parse the header and tensor table before the (slow) conversion: an empty, truncated or
    foreign file fails here with one clear line."""
    from gguf import GGUFReader

    try:
        GGUFReader(path)
    except Exception as exc:  # the reader raises ValueError, struct errors, IndexError...
        raise UserError(f"cannot load model {str(path)!r}: not a valid GGUF file ({exc})") from None
