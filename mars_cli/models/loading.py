"""Model specs -> loaded (model, tokenizer): an embedded name, a Hugging Face repo id, a local model
directory or a `.gguf` file (converted once, gguf_cache.py)."""

from __future__ import annotations

import contextlib
import os
import pickle
from pathlib import Path
from typing import Callable

import torch

from .. import reads
from ..errors import UserError, first_line, require
from ..notes import warn
from .device import resolve_device, resolve_dtype, unmeasured_auto_dtype
from .embedded import EMBEDDED
from .gguf_cache import gguf_cache_entry
from .loaded import LoadedModel
from .quiet import _quiet_loading


def resolve_spec(spec: str) -> tuple[Path | str, str | None]:
    """Spec -> (directory or repo id, gguf file name or None)."""
    if spec in EMBEDDED:
        gguf = EMBEDDED[spec].locate_gguf()
        return gguf, gguf.name
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        require(path.exists() or path.is_symlink(), f"model file not found: {spec}")
        require(not path.is_dir(), f"{spec} is a directory, not a GGUF file")
        require(path.is_file(), f"{spec} is not a regular file (a FIFO, socket, device or dangling link): "
                                "name a GGUF file")
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
    if isinstance(location, Path):  # a warm server's session is rebuilt when these change (reads.py)
        reads.read_path(location)
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
    loaded = LoadedModel(spec, source, model, tokenizer, input_device, torch_dtype,
                         directory=location if isinstance(location, Path) else None,
                         converted_copies=Path(location) / COPIES if gguf_name is not None else None)
    if loaded.directory is not None:
        loaded.fingerprint  # noqa: B018 - read (or remembered) now, while the weights are as the files hold them
    return loaded


def kept_in_float32(model: torch.nn.Module, dtype: torch.dtype) -> Callable[[str], bool]:
    """Which parameters transformers keeps in float32 when loading in `dtype` (a model's
    `_keep_in_fp32_modules`): a converted model matches one loaded in that dtype."""
    plan = getattr(model, "_get_dtype_plan", None)
    patterns = list(plan(dtype)) if callable(plan) else []
    return lambda name: any(pattern in name for pattern in patterns)


COPIES = "dtypes"  # <GGUF cache entry>/dtypes/<dtype>.safetensors: its weights converted once per dtype


def convert_weights(loaded: LoadedModel, dtype: torch.dtype) -> None:
    """`loaded`'s weights in `dtype` from now on, in place. A model from a GGUF cache entry reads the
    entry's copy in that dtype (memory-mapped, bit for bit the cast it replaces) where one is
    stored, else is cast and stores one for the next process: a cast of SmolLM2-135M to bfloat16
    took seconds on a 2-core CPU, the read a fraction of one."""
    copy = loaded.converted_copies / f"{str(dtype).replace('torch.', '')}.safetensors" \
        if loaded.converted_copies is not None else None
    if copy is not None and _read_converted(loaded.model, copy, dtype):
        _label(loaded.model, dtype)
        return
    cast_parameters(loaded.model, dtype)
    if copy is not None:
        _store_converted(loaded.model, copy, dtype)


def _converted(model: torch.nn.Module, dtype: torch.dtype) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters a conversion to `dtype` changes (floating, not kept in float32)."""
    kept = kept_in_float32(model, dtype)
    return [(name, p) for name, p in model.named_parameters() if p.is_floating_point() and not kept(name)]


def _read_converted(model: torch.nn.Module, copy: Path, dtype: torch.dtype) -> bool:
    """Take the converted parameters from `copy`; False (nothing changed) where it is missing,
    unreadable or does not hold exactly these parameters in `dtype` with these shapes."""
    from safetensors import SafetensorError, safe_open

    wanted = _converted(model, dtype)
    try:
        with safe_open(copy, framework="pt") as stored:
            if set(stored.keys()) != {name for name, _ in wanted}:
                return False
            tensors = {name: stored.get_tensor(name) for name, _ in wanted}
    except (OSError, SafetensorError, ValueError):
        return False
    if any(tensors[name].dtype != dtype or tensors[name].shape != p.shape for name, p in wanted):
        return False
    with torch.no_grad():
        for name, parameter in wanted:
            parameter.data = tensors[name].to(parameter.device)
    return True


def _store_converted(model: torch.nn.Module, copy: Path, dtype: torch.dtype) -> None:
    """Write the converted parameters whole (a temporary file, then a rename); a cache that cannot
    be written is skipped (the next process casts again)."""
    from safetensors.torch import save_file

    temporary = copy.with_name(f"{copy.name}.tmp-{os.getpid()}")
    try:
        copy.parent.mkdir(exist_ok=True)
        save_file({name: p.data.detach().cpu().contiguous() for name, p in _converted(model, dtype)}, temporary)
        os.replace(temporary, copy)
    except (OSError, RuntimeError):
        with contextlib.suppress(OSError):
            temporary.unlink()


def _label(model: torch.nn.Module, dtype: torch.dtype) -> None:
    config = getattr(model, "config", None)
    if config is not None:  # an unusual config that refuses the label keeps its old one
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            config.dtype = dtype


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Convert the floating-point parameters in place, as loading in `dtype` would have them;
    buffers stay (RoPE's float32 frequencies: `model.to(dtype)` would round them, and positions
    far into a sequence with them)."""
    kept = kept_in_float32(model, dtype)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.is_floating_point() and parameter.dtype != dtype and not kept(name):
                parameter.data = parameter.data.to(dtype)
    _label(model, dtype)
