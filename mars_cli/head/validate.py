"""Checks of a draft head's files, run before anything is built from them.

A head directory or file comes from anywhere (a download, a colleague, a typo), so it is read the
way a schema would read it: each file must be a small enough regular file (a FIFO would block the
read forever, a device would stream without end), each config field must have its type and range,
the tensors' shapes are read from the safetensors header and compared with the config, and the
sizes the config declares are weighed against the target and the machine's memory. Only then is
a module allocated. Every refusal is a `UserError` of one line that names the file and the field.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import UserError, first_line
from ..inputs import file_kind, read_at_most

MAX_CONFIG_BYTES = 1 << 20  # a head's config.json is a few KiB; more is not a config
# the most a head may declare, in parameters, whatever the target: 4e9 (16 GB in float32)
MAX_HEAD_PARAMETERS = 4_000_000_000
# a head may be this many times its target's size (real ones are a few percent of it); tiny targets
# get the floor, so that a test or toy target can still carry a head wider than itself
TARGET_FACTOR, PARAMETER_FLOOR = 2, 64_000_000
BYTES_PER_PARAMETER = 4  # heads compute in float32 whatever their file's dtype

FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
INT_DTYPES = {"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64"}


# --------------------------------------------------------------------------- files
def regular_file(path: Path) -> bool:
    """True for a regular file (through symlinks), False when nothing is there; anything else
    (a FIFO, a directory, a device) is refused before it is opened: reading a FIFO blocks forever."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{path} is {file_kind(mode)}, not a regular file")
    return True


def read_small_file(path: Path, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (see `inputs.read_at_most`)."""
    if not regular_file(path):
        raise FileNotFoundError(path)
    try:
        data, mode = read_at_most(path, limit)
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{path} is {file_kind(mode)}, not a regular file")
    if len(data) > limit:
        raise UserError(f"{path} is larger than {limit // 1024} KiB: not a head's config")
    return data


def read_json_object(path: Path) -> dict:
    """A small JSON object file; malformed, too deep (RecursionError) or not an object: one line."""
    data = read_small_file(path)
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise UserError(f"{path} is not UTF-8 (byte {error.start})") from None
    except RecursionError:
        raise UserError(f"{path} is not a head's config: JSON nested too deep") from None
    except ValueError as error:
        raise UserError(f"{path} is not readable JSON: {error}") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} must hold a JSON object, not {type(value).__name__}")
    return value


# --------------------------------------------------------------------------- fields
MISSING: Any = object()


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(data: dict, name: str, where: str, default: Any = MISSING) -> Any:
    """data[name] as an integer >= 1; `default` when absent or null (MISSING: required)."""
    value = data.get(name)
    if value is None:
        if default is MISSING:
            raise UserError(f"{where}: no `{name}`")
        return default
    if not is_int(value) or value < 1:
        raise UserError(f"{where}: `{name}` must be a positive integer, got {value!r:.60}")
    return value


def positive_number(data: dict, name: str, where: str, default: float) -> float:
    """data[name] as a finite number > 0 (an int or a float, not a string or a list)."""
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{where}: `{name}` must be a finite number > 0, got {value!r:.60}")
    return float(value)


def _optional(data: dict, name: str, where: str, kind: type, default: object, what: str) -> object:
    """data[name] when it is a `kind` (`default` when absent or null), else one line."""
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise UserError(f"{where}: `{name}` must be {what}, got {value!r:.60}")
    return value


def boolean(data: dict, name: str, where: str, default: bool) -> bool:
    return _optional(data, name, where, bool, default, "true or false")  # type: ignore[return-value]


def optional_dict(data: dict, name: str, where: str) -> dict:
    """data[name] as a JSON object ({} when absent or null)."""
    return _optional(data, name, where, dict, {}, "a JSON object")  # type: ignore[return-value]


def optional_str(data: dict, name: str, where: str) -> str:
    return _optional(data, name, where, str, "", "a string")  # type: ignore[return-value]


def known_rope_types() -> list[str]:
    """The RoPE variants transformers computes (what an EAGLE-3 head's `rope_scaling` may name)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ["default", *ROPE_INIT_FUNCTIONS]


def rope_scaling(data: dict, where: str) -> dict | None:
    """`rope_scaling`: null, or an object whose `rope_type` (or legacy `type`) is a known variant
    and whose numbers are finite. Whether the variant has all it needs is checked when the
    frequencies are computed (`check_rope`)."""
    value = data.get("rope_scaling")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise UserError(f"{where}: `rope_scaling` must be a JSON object or null, got {type(value).__name__}")
    kind = value.get("rope_type", value.get("type", "default"))
    known = known_rope_types()
    if kind not in known:
        raise UserError(f"{where}: `rope_scaling` has rope_type {kind!r:.40}; known: {', '.join(known)}")
    for key, item in value.items():
        items = item if isinstance(item, list) else [item]
        for number in items:
            if isinstance(number, float) and not math.isfinite(number):
                raise UserError(f"{where}: `rope_scaling.{key}` must be finite, got {number}")
            if isinstance(number, (dict, list)):
                raise UserError(f"{where}: `rope_scaling.{key}` must be a number or a list of numbers")
    return value


def check_rope(compute: Callable[[], tuple[Any, float]], where: str) -> None:
    """Run the RoPE computation once before the head is built: a variant that lacks a parameter
    (llama3 without `factor`) or has a nonsensical one fails here, as one line."""
    import torch

    try:
        inverse, scale = compute()
    except (KeyError, ValueError, TypeError, ZeroDivisionError, AttributeError, OverflowError) as error:
        raise UserError(f"{where}: `rope_scaling` is unusable: {first_line(error)}") from None
    if not bool(torch.isfinite(inverse).all()) or not math.isfinite(scale):
        raise UserError(f"{where}: `rope_scaling` and `rope_theta` give non-finite RoPE frequencies")


# --------------------------------------------------------------------------- tensors
@dataclass(frozen=True)
class TensorInfo:
    """What a safetensors header says of a tensor: its dtype (`F16`, `I64`, ...) and shape."""

    dtype: str
    shape: tuple[int, ...]


def header_tensors(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """The tensors a safetensors file holds and its metadata, from the header alone (no tensor is
    read). A regular file only; a bad header is one line."""
    from safetensors import SafetensorError, safe_open

    if not regular_file(path):
        raise UserError(f"draft head not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            infos = {}
            for name in handle.keys():
                piece = handle.get_slice(name)
                infos[name] = TensorInfo(str(piece.get_dtype()), tuple(piece.get_shape()))
    except (OSError, SafetensorError, ValueError) as error:
        raise UserError(f"cannot read draft head {path}: not a safetensors file ({first_line(error)})") from None
    return infos, metadata


def tensor_infos(tensors: dict, where: str) -> dict[str, TensorInfo]:
    """TensorInfo of loaded tensors (a pickled checkpoint has no header to read first)."""
    names = {"torch.float16": "F16", "torch.bfloat16": "BF16", "torch.float32": "F32", "torch.float64": "F64",
             "torch.int64": "I64", "torch.int32": "I32", "torch.int16": "I16", "torch.int8": "I8",
             "torch.uint8": "U8", "torch.bool": "BOOL"}
    infos = {}
    for name, tensor in tensors.items():
        if not hasattr(tensor, "shape") or not hasattr(tensor, "dtype"):
            raise UserError(f"{where}: `{name}` is not a tensor")
        infos[name] = TensorInfo(names.get(str(tensor.dtype), str(tensor.dtype)), tuple(tensor.shape))
    return infos


def compare_shapes(found: dict[str, TensorInfo], expected: dict[str, tuple[int, ...]], where: str, kind: str,
                   optional: frozenset[str] = frozenset(), ignored: tuple[str, ...] = ()) -> None:
    """The tensors present must be exactly those the config implies, with its shapes (`optional`
    ones may be absent, `ignored` ones may be present); `kind` names the format in a refusal."""
    present = {k for k in found if k not in ignored}
    missing = sorted(set(expected) - present - optional)
    unexpected = sorted(present - set(expected))
    if missing or unexpected:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + \
                ([f"unexpected {', '.join(unexpected)}"] if unexpected else [])
        raise UserError(f"{where}: not {kind}: {'; '.join(parts)}")
    for name, shape in expected.items():
        if name in found and found[name].shape != tuple(shape):
            raise UserError(f"{where}: `{name}` has shape {list(found[name].shape)}, the config says {list(shape)}")


def check_dtypes(found: dict[str, TensorInfo], integer: tuple[str, ...], where: str,
                 flags: tuple[str, ...] = ()) -> None:
    """Index tensors (`integer`: d2t, vocab_ids) must hold integers, a float index is truncated
    silently; masks (`flags`) booleans or integers; every other tensor floating-point weights."""
    for name, info in found.items():
        if name in integer:
            ok, want = info.dtype in INT_DTYPES, "integers"
        elif name in flags:
            ok, want = info.dtype in INT_DTYPES | {"BOOL"}, "booleans"
        else:
            ok, want = info.dtype in FLOAT_DTYPES, "floating-point weights"
        if not ok:
            raise UserError(f"{where}: `{name}` must hold {want}, it holds {info.dtype}")


# --------------------------------------------------------------------------- sizes
def available_memory() -> int | None:
    """Bytes of memory available now (MemAvailable), None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as stream:
            fields = dict(line.split(":", 1) for line in stream if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, ValueError, IndexError, KeyError):  # no /proc: what sysconf says, if anything
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return None


def parameter_limit(target_parameters: int | None) -> int:
    """The most parameters a head may declare: TARGET_FACTOR x its target (at least
    PARAMETER_FLOOR), never over MAX_HEAD_PARAMETERS nor what the memory available holds."""
    limit = MAX_HEAD_PARAMETERS
    if target_parameters:
        limit = min(limit, max(TARGET_FACTOR * target_parameters, PARAMETER_FLOOR))
    memory = available_memory()
    if memory:
        limit = min(limit, max(memory // BYTES_PER_PARAMETER, 1))
    return limit


def check_size(shapes: dict[str, tuple[int, ...]], fields: dict[str, int], where: str, limit: int) -> None:
    """Refuse a head whose declared tensors exceed `limit` parameters, naming the largest of the
    config fields that size it (`fields`: name -> value), before anything is allocated."""
    total = sum(math.prod(shape) for shape in shapes.values())
    if total <= limit:
        return
    name, value = max(fields.items(), key=lambda item: item[1])
    raise UserError(f"{where}: `{name}` {value} declares a head of {total:.3g} parameters, more than "
                    f"{limit:.3g} (twice its target, or the memory available); refusing to allocate it")
