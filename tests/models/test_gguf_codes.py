"""A GGUF linear's codes read from the file's blocks (mars_cli/models/gguf_codes.py, issue 73): for
every block type read, `offset + scale * code` is gguf-py's own dequantisation of the same bytes,
equal in float32 (only a zero's sign may differ: gguf-py's d * 0 is -0.0 where d < 0); the tensor
table is gguf.GGUFReader's; a tiny Llama GGUF's linears are all read from the blocks, in the rows
transformers permuted, and served by `--dtype q4`'s install; the embedded SmolLM2's too, with the
codes the search in the floats finds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize, quantize

from mars_cli.decoding import quantized
from mars_cli.models import gguf_codes

Kind = GGMLQuantizationType
QUANTIZED_BY_GGUF_PY = [Kind.Q4_0, Kind.Q4_1, Kind.Q5_0, Kind.Q5_1, Kind.Q8_0]  # gguf-py quantizes these
K_QUANTS = [Kind.Q4_K, Kind.Q5_K]  # gguf-py only dequantizes these: random blocks stand in
LEVELS = {Kind.Q4_0: 16, Kind.Q4_1: 16, Kind.Q4_K: 16, Kind.Q5_0: 256, Kind.Q5_1: 256, Kind.Q5_K: 256,
          Kind.Q8_0: 256}


def weights(rows: int, columns: int, seed: int) -> np.ndarray:
    """Random float weights with outliers (a group's largest value sets Q4_0's and Q8_0's scale)."""
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal((rows, columns)) * 0.02).astype(np.float32)
    data[rng.integers(0, rows, 8), rng.integers(0, columns, 8)] = rng.choice([-1.5, 0.9, 3.0], 8)
    data[1, :32] = 0.25  # a constant group
    return data


def blocks_of(kind: Kind, rows: int, columns: int, seed: int) -> np.ndarray:
    """A tensor's bytes [rows, bytes per row]: gguf-py's quantization of random weights, or for a
    K-quant random blocks (every bit pattern of scales, mins and codes) with finite fp16 d and dmin
    of either sign."""
    if kind not in K_QUANTS:
        return quantize(weights(rows, columns, seed), kind)
    block_size, type_size = GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * columns // block_size, type_size), dtype=np.uint8)
    raw[:, 0:4] = (rng.standard_normal((raw.shape[0], 2)) * 2e-3).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def rebuilt(found: gguf_codes.BlockCodes) -> np.ndarray:
    rows, columns = found.codes.shape
    codes = found.codes.numpy().reshape(rows, -1, quantized.GROUP)
    return (codes * found.scale.numpy()[..., None] + found.offset.numpy()[..., None]).reshape(rows, columns)


def assert_exact(found: gguf_codes.BlockCodes, expected: np.ndarray) -> None:
    """Equal as float32 numbers, and bit for bit but for a zero's sign."""
    ours = rebuilt(found)
    assert ours.dtype == np.float32 and np.array_equal(ours, expected)
    assert bool(((ours.view(np.int32) == expected.view(np.int32)) | (ours == 0)).all())


def write_tensors(path: Path, tensors: dict[str, tuple[Kind, np.ndarray]]) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch="llama")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(300)])  # an array of strings, skipped
    for name, (kind, raw) in tensors.items():
        writer.add_tensor(name, raw, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("kind", QUANTIZED_BY_GGUF_PY + K_QUANTS, ids=lambda kind: kind.name)
def test_each_types_codes_rebuild_gguf_pys_dequantisation_exactly(tmp_path, kind):
    rows, columns = (64, 256) if kind not in K_QUANTS else (32, 512)
    path = write_tensors(tmp_path / "one.gguf", {"w.weight": (kind, blocks_of(kind, rows, columns, 0))})
    architecture, table = gguf_codes.tensor_table(path)
    entry = table["w.weight"]
    assert architecture == "llama" and entry.kind == kind and entry.shape == (rows, columns)
    found = gguf_codes.read_tensor(np.memmap(path, dtype=np.uint8, mode="r"), entry)
    (stored,) = GGUFReader(path).tensors
    assert found.levels == LEVELS[kind] and int(found.codes.max()) < found.levels
    assert found.codes.dtype == torch.uint8 and found.scale.shape == (rows, columns // quantized.GROUP)
    assert_exact(found, dequantize(stored.data, kind))


def test_the_tensor_table_is_gguf_readers(tmp_path):
    tensors = {f"t{i}.weight": (kind, blocks_of(kind, 32 * (i + 1), 256, i))
               for i, kind in enumerate(QUANTIZED_BY_GGUF_PY + K_QUANTS)}
    tensors["norm.weight"] = (Kind.F32, np.ones(256, dtype=np.float32).view(np.uint8))  # not a matrix: left out
    path = write_tensors(tmp_path / "many.gguf", tensors)
    _, table = gguf_codes.tensor_table(path)
    reader = GGUFReader(path)
    matrices = {t.name: t for t in reader.tensors if len(t.shape) == 2}
    assert set(table) == set(matrices) == set(tensors) - {"norm.weight"}
    for name, tensor in matrices.items():
        assert (table[name].start, table[name].kind, table[name].shape) == \
            (tensor.data_offset, tensor.tensor_type, (int(tensor.shape[1]), int(tensor.shape[0])))


@pytest.mark.parametrize("kind", [Kind.Q6_K, Kind.F16, Kind.F32, Kind.IQ4_NL], ids=lambda kind: kind.name)
def test_types_without_one_scale_per_32_weights_are_left_to_the_search(kind):
    block_size, type_size = GGML_QUANT_SIZES[kind]
    raw = np.zeros(16 * 256 // block_size * type_size, dtype=np.uint8)
    assert gguf_codes.decode(raw, kind, (16, 256)) is None


def test_a_truncated_file_or_a_foreign_one_is_refused(tmp_path):
    path = write_tensors(tmp_path / "cut.gguf", {"w.weight": (Kind.Q8_0, blocks_of(Kind.Q8_0, 64, 256, 0))})
    _, table = gguf_codes.tensor_table(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    with pytest.raises(ValueError, match="past the end"):
        gguf_codes.read_tensor(data[:-100], table["w.weight"])
    (tmp_path / "foreign.gguf").write_bytes(b"GGUF\x01\x00\x00\x00" + bytes(64))
    with pytest.raises(ValueError):
        gguf_codes.tensor_table(tmp_path / "foreign.gguf")


# --- a tiny Llama GGUF, loaded through transformers as mars loads one

HIDDEN, FFN, HEADS, KV_HEADS = 64, 256, 4, 2
LAYER_TYPES = {"attn_q": Kind.Q4_0, "attn_k": Kind.Q5_0, "attn_v": Kind.Q4_1, "attn_output": Kind.Q5_1,
               "ffn_gate": Kind.Q8_0, "ffn_up": Kind.Q4_1}
DOWN_TYPES = [Kind.Q4_K, Kind.Q5_K]  # ffn_down of layers 0 and 1 (256 inputs: a K-quant super-block)


VOCAB = 320  # a byte-level vocabulary (the embedded model's 49k tokens took a minute to write and convert)


def write_quantized_llama(path: Path) -> Path:
    """Two layers of every type read here and an untied Q8_0 output layer, with a small byte-level
    tokenizer."""
    from gguf import GGUFWriter
    from tokenizers.pre_tokenizers import ByteLevel

    writer = GGUFWriter(str(path), arch="llama")
    for key, value in {"llama.block_count": 2, "llama.embedding_length": HIDDEN, "llama.feed_forward_length": FFN,
                       "llama.attention.head_count": HEADS, "llama.attention.head_count_kv": KV_HEADS,
                       "llama.rope.dimension_count": HIDDEN // HEADS, "llama.context_length": 256}.items():
        writer.add_uint32(key, value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    tokens = sorted(ByteLevel.alphabet()) + ["\u0120t"]
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", tokens + [f"<x{i}>" for i in range(VOCAB - len(tokens))])
    writer.add_array("tokenizer.ggml.token_type", [1] * VOCAB)
    writer.add_array("tokenizer.ggml.merges", ["\u0120 t"])
    writer.add_uint32("tokenizer.ggml.bos_token_id", 257)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 258)
    rng = np.random.default_rng(1)
    writer.add_tensor("token_embd.weight", (rng.standard_normal((VOCAB, HIDDEN)) * 0.02).astype(np.float16))
    writer.add_tensor("output.weight", blocks_of(Kind.Q8_0, VOCAB, HIDDEN, 2), raw_dtype=Kind.Q8_0)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (HIDDEN // HEADS * KV_HEADS, HIDDEN),
              "attn_v": (HIDDEN // HEADS * KV_HEADS, HIDDEN), "attn_output": (HIDDEN, HIDDEN),
              "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN)}
    for layer in range(2):
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
        for seed, (name, kind) in enumerate(LAYER_TYPES.items()):
            writer.add_tensor(f"blk.{layer}.{name}.weight", blocks_of(kind, *shapes[name], 10 * layer + seed),
                              raw_dtype=kind)
        down = DOWN_TYPES[layer]
        writer.add_tensor(f"blk.{layer}.ffn_down.weight", blocks_of(down, HIDDEN, FFN, 7 + layer), raw_dtype=down)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """The tiny quantized Llama, loaded (converted once into the module's own cache)."""
    from mars_cli.models import load_model

    folder = tmp_path_factory.mktemp("quantized-llama")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MARS_CACHE", str(folder / "cache"))
        path = write_quantized_llama(folder / "tiny-q.gguf")
        return path, load_model(str(path), device="cpu", dtype="float32")


def linear_names(model: torch.nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


def test_every_linear_of_a_quantized_llama_is_read_from_its_blocks_in_transformers_rows(tiny_gguf):
    path, loaded = tiny_gguf
    names = linear_names(loaded.model)
    found = gguf_codes.linear_codes(path, loaded.model, names)
    assert set(found) == set(names) and len(names) == 15  # 7 a layer and the untied output layer
    modules = dict(loaded.model.named_modules())
    for name, codes in found.items():
        assert gguf_codes.reproduces(codes, modules[name].weight)
        assert codes.levels == LEVELS[Kind.Q8_0 if name == "lm_head" else _kind_of(name)]
    _, table = gguf_codes.tensor_table(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    as_stored = gguf_codes.read_tensor(data, table["blk.0.attn_q.weight"])
    q = found["model.layers.0.self_attn.q_proj"]
    assert not torch.equal(as_stored.codes, q.codes)  # the rows transformers permuted for rotary attention
    assert sorted(map(tuple, as_stored.codes.tolist())) == sorted(map(tuple, q.codes.tolist()))


def _kind_of(name: str) -> Kind:
    layer = int(name.split(".")[2])
    hf = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
          "gate_proj": "ffn_gate", "up_proj": "ffn_up"}
    short = name.rsplit(".", 1)[1]
    return DOWN_TYPES[layer] if short == "down_proj" else LAYER_TYPES[hf[short]]


def test_a_weight_the_blocks_do_not_reproduce_is_searched_instead(tiny_gguf):
    path, loaded = tiny_gguf
    layer = loaded.model.model.layers[1].mlp.up_proj
    kept = layer.weight.detach().clone()
    try:
        with torch.no_grad():
            layer.weight[3, 5] += 1e-3
        found = gguf_codes.linear_codes(path, loaded.model, linear_names(loaded.model))
        assert "model.layers.1.mlp.up_proj" not in found and len(found) == 14
    finally:
        with torch.no_grad():
            layer.weight.copy_(kept)


def test_install_reads_the_blocks_says_so_and_stores_where_each_layers_codes_came_from(tiny_gguf, tmp_path):
    path, loaded = tiny_gguf
    entry = tmp_path / "entry"  # the cache entry's manifest (where its GGUF is), copies of our own
    entry.mkdir()
    (entry / "manifest.json").write_text((loaded.converted_copies.parent / "manifest.json").read_text())
    copy = entry / "dtypes" / quantized.COPY_NAME
    model = loaded.model
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(0))
    expected = model.model.layers[0].self_attn.q_proj(x)
    try:
        done = quantized.install(model, copy)
        assert (done.quantized, done.exact, done.read) == (15, 15, False) and copy.is_file()
        assert done.sources == {"blocks": 15, "search": 0, "fresh": 0}
        assert "15 read from the GGUF file's blocks, 0 recovered" in quantized.sources_note("q4", done)
        assert torch.allclose(model.model.layers[0].self_attn.q_proj(x), expected, rtol=1e-5, atol=1e-6)
        quantized.remove(model)
        again = quantized.install(model, copy)
        assert again.read and again.sources == done.sources
    finally:
        quantized.remove(model)


@pytest.mark.embedded
def test_the_embedded_q4_1_models_linears_are_all_read_from_its_blocks(smollm2, tmp_path):
    """Every linear of SmolLM2-135M-Instruct.Q4_1 (210 Q4_1 and the tied Q8_0 output layer): read
    from the blocks, none searched; a Q4_1 layer's codes, scales and offsets are the ones the search
    finds in the floats, the output layer's codes too up to a group's shift (the search counts
    from the group's least value, Q8_0 from -128 d)."""
    entry = tmp_path / "entry"  # the cache entry's manifest (where its GGUF is): no copy of the session's touched
    entry.mkdir()
    (entry / "manifest.json").write_text((smollm2.converted_copies.parent / "manifest.json").read_text())
    names = linear_names(smollm2.model)
    found = quantized.file_codes(smollm2.model, entry / "dtypes" / quantized.COPY_NAME, names)
    assert set(found) == set(names) and len(names) == 211
    assert all(codes.exact and codes.source == quantized.FROM_BLOCKS for codes in found.values())
    modules = dict(smollm2.model.named_modules())
    rows = slice(0, 256)  # enough of the output layer's 49152 rows
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.7.self_attn.k_proj", "model.layers.29.mlp.down_proj"):
        searched, read = quantized.recover(modules[name].weight[rows]), found[name]
        assert searched.exact and read.levels == searched.levels == 16
        assert torch.equal(read.codes[rows], searched.codes) and torch.equal(read.scale[rows], searched.scale)
        assert torch.equal(read.offset[rows], searched.offset)
    searched, read = quantized.recover(modules["lm_head"].weight[rows]), found["lm_head"]
    assert searched.exact and read.levels == searched.levels == 256 and torch.equal(read.scale[rows], searched.scale)
    grouped_read = read.codes[rows].reshape(256, -1, quantized.GROUP)
    grouped_search = searched.codes.reshape(256, -1, quantized.GROUP)
    assert torch.equal(grouped_read - grouped_read.amin(-1, keepdim=True),
                       grouped_search - grouped_search.amin(-1, keepdim=True))


def test_a_gguf_no_longer_where_its_cache_entry_says_leaves_every_layer_to_the_search(tiny_gguf, tmp_path):
    import json

    _, loaded = tiny_gguf
    entry = tmp_path / "entry"
    entry.mkdir()
    manifest = json.loads((loaded.converted_copies.parent / "manifest.json").read_text())
    (entry / "manifest.json").write_text(json.dumps({**manifest, "gguf_sha256": "0" * 64}))  # another file now
    try:
        done = quantized.install(loaded.model, entry / "dtypes" / quantized.COPY_NAME)
        assert done.quantized == 15 and done.sources[quantized.FROM_BLOCKS] == 0
        assert done.sources[quantized.SEARCHED] + done.sources[quantized.FRESH] == 15
    finally:
        quantized.remove(loaded.model)
