"""A GGUF linear's integer codes read from the file's own blocks, for `--dtype q4`
(decoding/quantized.py): `offset + scale * code` per group of 32 inputs, exactly the float32 weights
transformers loaded, in seconds (finding them again in the floats took 30-60 s for SmolLM2-135M).

Read from the blocks: Q4_0, Q4_1, Q4_K (16 levels) and Q5_0, Q5_1, Q5_K, Q8_0 (as 8-bit codes,
0..255). Each block type keeps one scale and one offset per 32 weights, whose float32 arithmetic
reproduces gguf-py's dequantisation bit for bit (the products of fp16 numbers by small integers are
exact in float32; the one rounded addition is the same). Not read: Q6_K (a scale per 16 weights),
IQ4_NL and the other non-linear or finer types, whose weights are no `offset + scale * code` per 32
with one scale; quantized.recover searches their floats. Every layer read here is checked against
the weight transformers loaded (equal, not close) and dropped if it differs: the search decides.

The rows follow transformers' loading: its tensor processor (Llama's q/k row permutation) is applied
to a column of row indices, and a tied output layer reads the embedding's tensor.

The file's tensor table is walked here, not by gguf.GGUFReader, which parses every metadata value
(SmolLM2's 49k-token vocabulary: 5-10 s on 2 cores); values are skipped, not parsed.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType

GROUP = 32  # weights per scale and offset: the codes' group (decoding/quantized.py)
SUPER = 256  # weights per K-quant super-block: 8 sub-blocks of GROUP
LEVELS_INT4, LEVELS_INT8 = 16, 256
Kind = GGMLQuantizationType


@dataclass
class BlockCodes:
    """A weight as groups of `offset + scale * code`: codes uint8 [out, in] (below `levels`), scale and
    offset float32 [out, in / GROUP]."""

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    levels: int  # 16 or 256


@dataclass
class TensorEntry:
    """One tensor of a GGUF file: its type, its [rows, columns] and where its bytes start."""

    name: str
    kind: int  # a GGMLQuantizationType's value (an unknown one stays an int)
    shape: tuple[int, int]
    start: int  # byte offset in the file


# --- the blocks: each decoder takes [blocks, bytes] uint8 and gives codes [blocks, weights], scale
# and offset [blocks, weights / GROUP]


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 number at byte `at` of each block, as float32 [blocks, 1] (exact)."""
    return np.ascontiguousarray(blocks[:, at:at + 2]).view("<f2").astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 codes per row: the low nibbles are codes 0-15, the high ones 16-31."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _high_bits(packed: np.ndarray) -> np.ndarray:
    """4 bytes (a little-endian 32-bit word) -> the 32 codes' fifth bits, bit j for code j."""
    return np.unpackbits(np.ascontiguousarray(packed), axis=-1, bitorder="little")


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp16 d, 16 bytes of nibbles: w = d * (q - 8)."""
    d = _half(blocks, 0)
    return _nibbles(blocks[:, 2:18]), d, -8 * d


def _q4_1(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp16 d and m, 16 bytes of nibbles: w = d * q + m."""
    return _nibbles(blocks[:, 4:20]), _half(blocks, 0), _half(blocks, 2)


def _q5_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp16 d, 4 bytes of fifth bits, 16 of nibbles: w = d * (q - 16)."""
    d = _half(blocks, 0)
    return _nibbles(blocks[:, 6:22]) | (_high_bits(blocks[:, 2:6]) << 4), d, -16 * d


def _q5_1(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp16 d and m, 4 bytes of fifth bits, 16 of nibbles: w = d * q + m."""
    return _nibbles(blocks[:, 8:24]) | (_high_bits(blocks[:, 4:8]) << 4), _half(blocks, 0), _half(blocks, 2)


def _q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp16 d, 32 int8 q: w = d * q, held as code q + 128 (the byte's top bit flipped) from -128 d."""
    d = _half(blocks, 0)
    return blocks[:, 2:34] ^ np.uint8(0x80), d, -128 * d


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes -> the 8 sub-blocks' 6-bit scales and mins. Bytes 0-3 hold scales 0-3 and bytes 4-7
    mins 0-3 in their low 6 bits; bytes 8-11 hold scales 4-7 (low nibble) and mins 4-7 (high nibble),
    whose top 2 bits are the top 2 bits of bytes 0-3 (scales) and 4-7 (mins)."""
    low, mid, high = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([low & 0x3F, (high & 0x0F) | ((low >> 6) << 4)], axis=-1)
    mins = np.concatenate([mid & 0x3F, (high >> 4) | ((mid >> 6) << 4)], axis=-1)
    return scales, mins


def _k_low_nibbles(packed: np.ndarray) -> np.ndarray:
    """128 bytes -> 256 4-bit codes: each 32 bytes hold two sub-blocks, the low nibbles first."""
    chunks = packed.reshape(-1, 4, 1, GROUP) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (chunks & 0x0F).reshape(-1, SUPER)


def _k_groups(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A K-quant super-block's fp16 d and dmin with its 6-bit scales and mins: scale d * sc, offset
    -dmin * m per sub-block (both products exact in float32)."""
    scales, mins = _k_scales(blocks[:, 4:16])
    return _half(blocks, 0) * scales.astype(np.float32), -(_half(blocks, 2) * mins.astype(np.float32))


def _q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """d, dmin, 12 bytes of scales and mins, 128 of nibbles: w = d sc q - dmin m per sub-block."""
    return (_k_low_nibbles(blocks[:, 16:144]), *_k_groups(blocks))


def _q5_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K's layout with 32 bytes of fifth bits before the nibbles: bit i of byte j is code j's of
    sub-block i."""
    fifth = (blocks[:, 16:48, None] >> np.arange(8, dtype=np.uint8)) & 1  # [blocks, j, i]
    fifth = fifth.transpose(0, 2, 1).reshape(-1, SUPER)
    return (_k_low_nibbles(blocks[:, 48:176]) | (fifth << 4), *_k_groups(blocks))


DECODERS = {Kind.Q4_0: (_q4_0, LEVELS_INT4), Kind.Q4_1: (_q4_1, LEVELS_INT4), Kind.Q4_K: (_q4_k, LEVELS_INT4),
            Kind.Q5_0: (_q5_0, LEVELS_INT8), Kind.Q5_1: (_q5_1, LEVELS_INT8), Kind.Q5_K: (_q5_k, LEVELS_INT8),
            Kind.Q8_0: (_q8_0, LEVELS_INT8)}


def decode(raw: np.ndarray, kind: int, shape: tuple[int, int]) -> BlockCodes | None:
    """A tensor's raw bytes (uint8, its blocks row by row) -> its codes, or None for a type whose
    weights are not `offset + scale * code` per GROUP (Q6_K, IQ*, floats)."""
    if kind not in DECODERS:
        return None
    decoder, levels = DECODERS[Kind(kind)]
    type_size = GGML_QUANT_SIZES[Kind(kind)][1]
    rows, columns = shape
    codes, scale, offset = decoder(np.asarray(raw, dtype=np.uint8).reshape(-1, type_size))
    return BlockCodes(torch.from_numpy(np.ascontiguousarray(codes.reshape(rows, columns))),
                      torch.from_numpy(np.ascontiguousarray(scale.reshape(rows, columns // GROUP))),
                      torch.from_numpy(np.ascontiguousarray(offset.reshape(rows, columns // GROUP))), levels)


# --- the file's tensor table, walked without parsing the metadata's values

_SCALARS = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
            GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4, GGUFValueType.BOOL: 1,
            GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}


class _Cursor:
    """Little-endian reads through a file's bytes (struct.error past their end)."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def take(self, layout: str) -> tuple:
        values = struct.unpack_from("<" + layout, self.data, self.at)
        self.at += struct.calcsize("<" + layout)
        return values

    def string(self) -> bytes:
        (length,) = self.take("Q")
        if self.at + length > len(self.data):
            raise ValueError("a string runs past the end of the file")
        self.at += length
        return self.data[self.at - length:self.at]

    def value(self, kind: int) -> object:
        """One metadata value: a string's or a scalar's is returned, an array skipped (None)."""
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            item, count = self.take("IQ")
            if item in _SCALARS:
                self.at += _SCALARS[GGUFValueType(item)] * count
            else:
                for _ in range(count):
                    self.value(item)
            return None
        size = _SCALARS[GGUFValueType(kind)]  # ValueError: a type this reader does not know
        value = int.from_bytes(self.data[self.at:self.at + size], "little")
        self.at += size
        return value


def tensor_table(path: Path) -> tuple[str, dict[str, TensorEntry]]:
    """The file's architecture and its 2-D tensors by name (ValueError, struct.error: not a GGUF
    file this reader understands)."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        magic, version, tensors, fields = cursor.take("4sIQQ")
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError("not a little-endian GGUF file of version 2 or 3")
        wanted = {"general.architecture": b"", "general.alignment": GGUF_DEFAULT_ALIGNMENT}
        for _ in range(fields):
            key = cursor.string().decode("utf-8", "replace")
            value = cursor.value(cursor.take("I")[0])
            if key in wanted:
                wanted[key] = value
        infos = [_tensor_info(cursor) for _ in range(tensors)]
        alignment = int(wanted["general.alignment"])
        start = -(-cursor.at // alignment) * alignment
    architecture = wanted["general.architecture"]
    table = {name: TensorEntry(name, kind, shape, start + offset) for name, kind, shape, offset in infos
             if shape is not None}
    return architecture.decode() if isinstance(architecture, bytes) else "", table


def _tensor_info(cursor: _Cursor) -> tuple[str, int, tuple[int, int] | None, int]:
    """One tensor's name, type, [rows, columns] (None unless a matrix) and offset in the data."""
    name = cursor.string().decode("utf-8", "replace")
    (dims,) = cursor.take("I")
    sizes = cursor.take("Q" * dims)  # the innermost (a row's length) first
    kind, offset = cursor.take("IQ")
    matrix = dims >= 2 and all(size == 1 for size in sizes[2:])
    return name, kind, (sizes[1], sizes[0]) if matrix else None, offset


def read_tensor(data: np.ndarray, entry: TensorEntry) -> BlockCodes | None:
    """`entry`'s codes from the file's bytes `data` (memory-mapped), or None where its type has none
    here (ValueError: its bytes run past the file's end)."""
    if entry.kind not in DECODERS:
        return None
    block_size, type_size = GGML_QUANT_SIZES[Kind(entry.kind)]
    rows, columns = entry.shape
    if columns % block_size:
        return None
    size = rows * (columns // block_size) * type_size
    if entry.start + size > data.shape[0]:
        raise ValueError(f"tensor {entry.name!r} runs past the end of the file")
    return decode(data[entry.start:entry.start + size], entry.kind, entry.shape)


# --- the file's tensors as transformers loaded them into the model


def tensor_names(model: torch.nn.Module, architecture: str) -> tuple[dict[str, list[str]], object, dict]:
    """Each linear module's weight -> the GGUF tensor names transformers may have loaded it from
    (every name of a tied weight: the output layer reads `token_embd.weight` where the file has no
    `output.weight`), with transformers' tensor processor for the file and its name map."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=model.config.to_dict())
    to_hf = _weights_map(model, architecture, processor)
    gguf_of: dict[str, list[str]] = {}
    for gguf_name, hf_name in to_hf.items():
        gguf_of.setdefault(hf_name, []).append(gguf_name)
    names_of: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(parameter), []).append(name)
    sources = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            aliases = names_of.get(id(module.weight), [])
            sources[name] = [gguf for alias in aliases for gguf in gguf_of.get(alias, [])]
    return sources, processor, to_hf


def _weights_map(model: torch.nn.Module, architecture: str, processor: object) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, as transformers' `get_gguf_hf_weights_map`
    maps them (each name, then its tail below each enclosing module; the outer name wins) with one
    gguf name map: transformers builds one per module of the model, 15 s for SmolLM2-135M. A name
    mapped wrongly costs nothing but time: the codes are checked against the weight."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == architecture), None)
    if arch is None:
        return {}
    name_map = get_tensor_name_map(arch, getattr(model.config, "num_hidden_layers", 0) or 0)
    full_names = list(model.state_dict())
    to_hf: dict[str, str] = {}
    for depth in range(max((name.count(".") for name in full_names), default=0)):
        for full in full_names:
            parts = full.split(".")
            if depth >= len(parts) - 1:
                continue
            tail = processor.preprocess_name(".".join(parts[depth:]))
            base, dot, suffix = tail.rpartition(".") if tail.endswith((".weight", ".bias")) else (tail, "", "")
            gguf_name = name_map.get_name(base)
            if gguf_name is not None:
                to_hf.setdefault(gguf_name + dot + suffix, ".".join(parts[:depth] + [tail]))
    return to_hf


def row_order(processor: object, to_hf: dict, name: str, rows: int) -> np.ndarray | None:
    """Which file row each row of the loaded weight is: transformers' processor (Llama's q/k
    permutation) applied to a column of row indices; None where it moves anything but whole rows."""
    column = np.arange(rows, dtype=np.int64).reshape(rows, 1)
    try:
        done = processor.process(weights=column, name=name, tensor_key_mapping=to_hf, parsed_parameters={"tensors": {}})
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
    order = np.asarray(done.weights)
    if done.name != name or order.shape != (rows, 1) or not np.array_equal(np.sort(order[:, 0]), column[:, 0]):
        return None
    return np.ascontiguousarray(order[:, 0])


CHECKED = 1 << 16  # weights rebuilt at a time by `reproduces`: a chunk's passes stay in the CPU's caches


def reproduces(found: BlockCodes, weight: torch.Tensor) -> bool:
    """Whether `offset + scale * code` in float32 equals `weight` at every element (a zero's sign
    aside: gguf-py's d * 0 is -0.0 where d < 0, ours 0.0). In numpy, one thread: torch's small
    operations waited milliseconds each for their threads on a busy 2-core machine."""
    if tuple(found.codes.shape) != tuple(weight.shape) or weight.dtype != torch.float32 or weight.device.type != "cpu":
        return False
    codes, scale, offset = found.codes.numpy(), found.scale.numpy(), found.offset.numpy()
    target = weight.detach().numpy()
    rows, columns = target.shape
    step = max(1, CHECKED // columns)
    for first in range(0, rows, step):
        part = slice(first, first + step)
        rebuilt = codes[part].reshape(-1, columns // GROUP, GROUP) * scale[part, :, None] + offset[part, :, None]
        if not np.array_equal(rebuilt.reshape(-1, columns), target[part]):
            return False
    return True


def _permuted(found: BlockCodes, order: np.ndarray) -> BlockCodes:
    """`found`'s rows in `order` (numpy's row gather: torch's on uint8 took 3 ms a 576x576 matrix)."""
    if np.array_equal(order, np.arange(order.size)):
        return found
    moved = [torch.from_numpy(tensor.numpy()[order]) for tensor in (found.codes, found.scale, found.offset)]
    return BlockCodes(*moved, found.levels)


def source_gguf(entry: Path) -> Path | None:
    """The GGUF file a cache entry (models/gguf_cache.py) was converted from, where it is still there
    unchanged (its sha256, remembered by file identity, is the entry's)."""
    from .gguf_cache import file_sha256

    try:
        manifest = json.loads((entry / "manifest.json").read_text())
        path = Path(manifest["source_gguf"])
        return path if path.is_file() and file_sha256(path) == manifest["gguf_sha256"] else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def linear_codes(gguf: Path, model: torch.nn.Module, names: list[str]) -> dict[str, BlockCodes]:
    """The codes of the linears `names` of `model` (loaded from `gguf`) read from the file's blocks,
    each equal to the weight transformers loaded; a linear of another type, unmapped or differing
    is left out (quantized.recover searches it)."""
    try:
        architecture, table = tensor_table(gguf)
        sources, processor, to_hf = tensor_names(model, architecture)
        data = np.memmap(gguf, dtype=np.uint8, mode="r")
    except (OSError, ValueError, KeyError, TypeError, struct.error, NotImplementedError, ImportError) as exc:
        # unreadable file, an architecture gguf's name map lacks: every layer is searched instead,
        # and the note on the codes' sources counts them; the reason is said once here
        from ..notes import note

        note(f"the codes of {gguf.name} could not be read from its blocks ({type(exc).__name__}: {exc}); "
             "they are searched in the de-quantized floats instead", once=True)
        return {}
    modules = dict(model.named_modules())
    found: dict[str, BlockCodes] = {}
    for name in names:
        for tensor in (t for t in sources.get(name, []) if t in table):
            read = _checked(data, table[tensor], processor, to_hf, modules[name].weight)
            if read is not None:
                found[name] = read
                break
    return found


def _checked(data: np.ndarray, entry: TensorEntry, processor: object, to_hf: dict,
             weight: torch.Tensor) -> BlockCodes | None:
    """`entry`'s codes in the loaded weight's row order, where they reproduce `weight` exactly."""
    try:
        read = read_tensor(data, entry)
    except ValueError:
        return None
    order = row_order(processor, to_hf, entry.name, entry.shape[0]) if read is not None else None
    if order is None:
        return None
    read = _permuted(read, order)
    return read if reproduces(read, weight) else None
