"""GGUF files dequantised once into a cached Hugging Face directory (safetensors + tokenizer),
keyed by the GGUF file's sha256, because transformers' own GGUF conversion takes 20-50 s per load.
Hashes are remembered by file identity (identity.py): a file is hashed once after it changes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import UserError, first_line
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
    started at the same time waits, then uses the entry the first one wrote. The file's first bytes
    are checked before it is hashed (hashing a large foreign file named .gguf took seconds), and its
    metadata once per file identity (a warm start stats the file)."""
    _check_gguf(gguf_path)
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
        try:
            _dequantise(gguf_path, staging)
        except (UserError, KeyboardInterrupt, MemoryError):
            raise
        except Exception as exc:  # transformers' conversion: ValueError, KeyError, TypeError...
            raise UserError(f"cannot convert GGUF file {str(gguf_path)!r}: {first_line(exc)}") from None
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
        model, info = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                           output_loading_info=True)
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # initialised at random, not read: a wrong model that loads silently (its warning is quietened)
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise UserError(f"cannot load model {str(gguf_path)!r}: the file lacks weights its architecture needs "
                        f"({missing[0]}{more})")
    # The weights are already dequantised; drop the GGUF quantizer marker so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with _quiet_loading():
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)


GGUF_MAGIC = b"GGUF"


def _check_magic(path: Path) -> None:
    """The first bytes of a GGUF file (magic and a version this reader knows), read before anything
    reads the whole file."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as exc:
        raise UserError(f"cannot load model {str(path)!r}: {exc.strerror or exc}") from None
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise UserError(f"cannot load model {str(path)!r}: not a valid GGUF file (it does not start with 'GGUF')")
    version = int.from_bytes(head[4:], "little")
    if version not in (2, 3):
        raise UserError(f"cannot load model {str(path)!r}: not a valid GGUF file (version {version}; 2 and 3 are read)")


# Sizes no real model reaches, refused before anything is built from them (a file claiming a million
# layers built a million-layer model): layers, heads, embedding width, context, vocabulary.
LIMITS = {"block_count": 4096, "attention.head_count": 4096, "attention.head_count_kv": 4096,
          "embedding_length": 1 << 18, "feed_forward_length": 1 << 20, "context_length": 1 << 24,
          "vocab_size": 1 << 24}
MIN_CONTEXT = 16  # positions: fewer cannot hold a chat template's turn and an answer


def _check_gguf(path: Path) -> None:
    """The first bytes, then the metadata (remembered by file identity: a warm start stats the file)."""
    _check_magic(path)
    identity.remembered("gguf-check", [path], lambda: _validate_gguf(path) or "valid")


def _validate_gguf(path: Path) -> None:
    """Parse the header and tensor table before the (slow) conversion, and check the metadata's
    numbers against each other and the file: an empty, truncated or foreign file, a missing or
    unsupported architecture, absurd sizes or tensors past the file's end fail here with one line."""
    from gguf import GGUFReader

    def refuse(why: str) -> UserError:
        return UserError(f"cannot load model {str(path)!r}: {why}")

    try:
        reader = GGUFReader(path)
    except Exception as exc:  # the reader raises ValueError, struct errors, IndexError...
        raise refuse(f"not a valid GGUF file ({first_line(exc)})") from None
    try:
        return _check_metadata(reader, path.stat().st_size)
    except UserError as exc:
        raise refuse(str(exc)) from None


def _field(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return field.contents()
    except Exception:  # a field whose value the reader cannot decode
        raise UserError(f"its metadata field {key!r} is malformed") from None


def _check_metadata(reader, file_size: int) -> None:
    architecture = _field(reader, "general.architecture")
    if architecture is None:
        raise UserError("no general.architecture in its metadata (a GGUF model names its architecture)")
    if not isinstance(architecture, str) or not architecture.isprintable() or not 0 < len(architecture) <= 64:
        raise UserError("its general.architecture is not an architecture name")
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # pragma: no cover - another transformers layout: its conversion decides
        GGUF_SUPPORTED_ARCHITECTURES = None
    special = ("t5", "qwen2moe", "qwen3moe", "gpt-oss", "gpt_oss", "minimax-m2")
    if GGUF_SUPPORTED_ARCHITECTURES is not None and architecture not in GGUF_SUPPORTED_ARCHITECTURES \
            and not any(name in architecture for name in special):
        raise UserError(f"architecture {architecture!r} is not one mars can convert "
                        f"(supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES)[:12])}, ...)")
    sizes: dict[str, int] = {}
    for name, limit in LIMITS.items():
        value = _field(reader, f"{architecture}.{name}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise UserError(f"its {architecture}.{name} is {value!r}, not a size a model has (1 to {limit})")
        sizes[name] = value
    if "block_count" not in sizes:
        raise UserError(f"no {architecture}.block_count in its metadata")
    heads, kv_heads = sizes.get("attention.head_count"), sizes.get("attention.head_count_kv")
    if heads is not None and kv_heads is not None and heads % kv_heads:
        raise UserError(f"{heads} attention heads cannot share {kv_heads} key-value heads")
    if sizes.get("context_length", MIN_CONTEXT) < MIN_CONTEXT:
        raise UserError(f"its context is {sizes['context_length']} positions: fewer than the {MIN_CONTEXT} "
                        "a prompt and an answer need")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None and not 1 <= len(tokens.data) <= LIMITS["vocab_size"]:
        raise UserError(f"its vocabulary has {len(tokens.data)} tokens")
    layers, total = set(), 0
    names = set()
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        total += int(tensor.n_bytes)
        if end > file_size or total > file_size:
            raise UserError(f"tensor {tensor.name!r} lies past the end of the file ({end} > {file_size} bytes)")
        names.add(tensor.name)
        if tensor.name.startswith("blk."):
            index = tensor.name.split(".")[1]
            if not index.isdigit() or int(index) >= sizes["block_count"]:
                raise UserError(f"tensor {tensor.name!r} names a layer the model does not have "
                                f"({architecture}.block_count is {sizes['block_count']})")
            layers.add(int(index))
    if len(layers) != sizes["block_count"]:
        raise UserError(f"its {architecture}.block_count is {sizes['block_count']} but it holds weights for "
                        f"{len(layers)} layers")
    if "token_embd.weight" not in names:
        raise UserError("the file lacks token_embd.weight, the token embeddings every model needs")
