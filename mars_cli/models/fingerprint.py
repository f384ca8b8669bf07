"""Fingerprints: the identity of a model's weights and tokenizer, the same whatever the file format
or device; profiles, heads and tuning entries are found by it. A directory's fingerprint is
remembered by its files' identity (identity.py), so it is read from the files once after they change."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Callable, Iterable

import torch

from ..errors import UserError, first_line, require
from . import identity
from .quiet import _quiet_loading


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
    Remembered by the directory's files' identity (identity.py), shared with `loaded_fingerprint`."""
    model_dir = Path(model_dir).resolve()
    files = directory_files(model_dir)
    if files is None:
        return _file_fingerprint(model_dir, per_tensor)
    return identity.remembered(f"fingerprint-{per_tensor}", files, lambda: _file_fingerprint(model_dir, per_tensor))


def loaded_fingerprint(loaded, per_tensor: int = 512) -> str:  # type: ignore[no-untyped-def]
    """A LoadedModel's fingerprint: remembered by its directory's files where it was loaded from
    one (computed from the weights in memory the first time, right after loading), else computed
    from the weights in memory."""
    files = directory_files(loaded.directory) if loaded.directory is not None else None
    compute = lambda: model_fingerprint(loaded.model, loaded.tokenizer, per_tensor)  # noqa: E731
    if files is None:
        return compute()
    return identity.remembered(f"fingerprint-{per_tensor}", files, compute)


def directory_files(directory: Path) -> list[Path] | None:
    """The regular files of a model directory, or None where it cannot be listed."""
    try:
        return sorted(entry for entry in Path(directory).iterdir() if entry.is_file())
    except OSError:
        return None


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
