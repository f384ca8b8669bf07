"""GGUF inputs (issue 67 items 3 and 4) on the default engine: metadata refused from its numbers
before anything is built, the header read before the file is hashed, a directory or FIFO named
x.gguf said to be one, and a file lacking a weight its architecture needs refused with nothing
cached. Test files are tiny random Llamas (2 layers, width 64) written with gguf's GGUFWriter,
carrying the embedded SmolLM2 GGUF's tokenizer metadata; `write_gguf` is shared with
tests_llamacpp/test_gguf_inputs.py."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pytest

from mars_cli.errors import UserError

HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 64, 128, 4, 2, 49152


@functools.lru_cache(maxsize=1)
def _base_fields() -> list[tuple[str, object, list]]:
    """The embedded GGUF's metadata (tokenizer, chat template...), read once."""
    from gguf import GGUFReader

    from mars_cli.models.embedded import EMBEDDED

    reader = GGUFReader(EMBEDDED["smollm2-135m"].locate_gguf())
    return [(key, field.contents(), list(field.types)) for key, field in reader.fields.items()
            if not key.startswith("GGUF.") and key != "general.architecture"]


def write_gguf(path: Path, *, arch: str = "llama", overrides: dict | None = None, drop: tuple = (),
               rename: dict | None = None, layers: int = 2) -> Path:
    """A tiny random Llama GGUF at `path`; `overrides` sets metadata, `drop` removes keys
    (general.architecture included), `rename` renames tensors."""
    from gguf import GGUFValueType, GGUFWriter

    sizes = {"llama.block_count": layers, "llama.embedding_length": HIDDEN, "llama.feed_forward_length": FFN,
             "llama.attention.head_count": HEADS, "llama.attention.head_count_kv": KV_HEADS,
             "llama.rope.dimension_count": HIDDEN // HEADS, "general.file_type": 1}
    values = {**sizes, **(overrides or {})}
    writer = GGUFWriter(str(path), arch=arch)
    for key, value, types in _base_fields():
        if key in values or key in drop:
            continue
        if types[0] == GGUFValueType.ARRAY:
            writer.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=types[-1])
        else:
            writer.add_key_value(key, value, types[0])
    for key, value in values.items():
        if key not in drop:
            writer.add_key_value(key, value, GGUFValueType.UINT64 if value >= 2**32 else GGUFValueType.UINT32)
    if "general.architecture" in drop:
        for table in writer.kv_data:
            table.pop("general.architecture", None)
    rng = np.random.default_rng(0)

    def tensor(name: str, shape: tuple[int, ...]) -> None:
        data = rng.standard_normal(shape) * 0.02
        writer.add_tensor((rename or {}).get(name, name), data.astype(np.float16 if len(shape) > 1 else np.float32))

    tensor("token_embd.weight", (VOCAB, HIDDEN))
    tensor("output_norm.weight", (HIDDEN,))
    for i in range(layers):
        for name, shape in [("attn_norm", (HIDDEN,)), ("ffn_norm", (HIDDEN,)), ("attn_q", (HIDDEN, HIDDEN)),
                            ("attn_k", (HIDDEN // HEADS * KV_HEADS, HIDDEN)),
                            ("attn_v", (HIDDEN // HEADS * KV_HEADS, HIDDEN)), ("attn_output", (HIDDEN, HIDDEN)),
                            ("ffn_gate", (FFN, HIDDEN)), ("ffn_up", (FFN, HIDDEN)), ("ffn_down", (HIDDEN, FFN))]:
            tensor(f"blk.{i}.{name}.weight", shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _entries(cache: Path) -> list[str]:
    models = cache / "models"
    return sorted(entry.name for entry in models.iterdir()) if models.is_dir() else []


@pytest.mark.parametrize("changes, says", [
    ({"overrides": {"llama.block_count": 10**6}}, "llama.block_count is 1000000, not a size a model has"),
    ({"overrides": {"llama.attention.head_count": 0}}, "llama.attention.head_count is 0"),
    ({"overrides": {"llama.attention.head_count_kv": 3}}, "4 attention heads cannot share 3 key-value heads"),
    ({"overrides": {"llama.context_length": 2**40}}, "llama.context_length is 1099511627776"),
    ({"overrides": {"llama.context_length": 4}}, "its context is 4 positions"),
    ({"overrides": {"llama.block_count": 5}}, "block_count is 5 but it holds weights for 2 layers"),
    ({"drop": ("general.architecture",)}, "no general.architecture in its metadata"),
    ({"arch": "rwkv7"}, "architecture 'rwkv7' is not one mars can convert"),
    ({"rename": {"token_embd.weight": "token_embx.weight"}}, "lacks token_embd.weight"),
])
def test_absurd_or_incomplete_metadata_is_refused_before_anything_is_built(tmp_path, cache, monkeypatch,
                                                                          changes, says):
    from mars_cli.models import gguf_cache

    monkeypatch.setattr(gguf_cache, "_dequantise", lambda *a: pytest.fail("converted a file it should refuse"))
    path = write_gguf(tmp_path / "bad.gguf", **changes)
    with pytest.raises(UserError, match="cannot load model") as refused:
        gguf_cache.gguf_cache_entry(path)
    assert says in str(refused.value) and "\n" not in str(refused.value)
    assert _entries(cache) == []


def test_tensors_past_the_end_of_the_file_are_refused(tmp_path, cache):
    from mars_cli.models.gguf_cache import gguf_cache_entry

    path = write_gguf(tmp_path / "cut.gguf")
    os.truncate(path, path.stat().st_size - 4096)
    with pytest.raises(UserError, match="cannot load model"):
        gguf_cache_entry(path)
    assert _entries(cache) == []


def test_a_missing_weight_is_a_one_line_refusal_and_nothing_is_cached(tmp_path, cache):
    """A renamed layer weight passes the metadata checks; transformers then initialises the
    weight at random (its warning quietened): the conversion refuses, and no entry is left."""
    from mars_cli.models import load_model

    path = write_gguf(tmp_path / "renamed.gguf", rename={"blk.1.ffn_up.weight": "blk.1.ffn_upx.weight"})
    with pytest.raises(UserError, match="lacks weights its architecture needs .model.layers.1.mlp.up_proj.weight"):
        load_model(str(path), device="cpu", dtype="float32")
    assert [name for name in _entries(cache) if not name.endswith(".lock")] == []


def test_the_header_is_checked_before_the_file_is_hashed(tmp_path, cache, monkeypatch):
    from mars_cli.models import gguf_cache

    monkeypatch.setattr(gguf_cache, "file_sha256", lambda path: pytest.fail("hashed a file that is not a GGUF"))
    sparse = tmp_path / "sparse.gguf"
    with open(sparse, "wb") as handle:
        handle.truncate(4 << 30)
    with pytest.raises(UserError, match="does not start with 'GGUF'"):
        gguf_cache.gguf_cache_entry(sparse)


def test_a_directory_or_fifo_named_gguf_is_said_to_be_one(tmp_path):
    from mars_cli.models import resolve_spec

    (tmp_path / "d.gguf").mkdir()
    os.mkfifo(tmp_path / "f.gguf")
    with pytest.raises(UserError, match="is a directory, not a GGUF file"):
        resolve_spec(str(tmp_path / "d.gguf"))
    with pytest.raises(UserError, match="is not a regular file .a FIFO"):
        resolve_spec(str(tmp_path / "f.gguf"))
    with pytest.raises(UserError, match="model file not found"):
        resolve_spec(str(tmp_path / "missing.gguf"))


def test_a_small_context_file_loads_with_its_window(tmp_path, cache):
    from mars_cli.models import load_model

    loaded = load_model(str(write_gguf(tmp_path / "small.gguf", overrides={"llama.context_length": 64})),
                        device="cpu", dtype="float32")
    assert loaded.context_window == 64
