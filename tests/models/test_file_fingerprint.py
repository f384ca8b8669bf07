"""file_fingerprint reads, from the safetensors files alone, the fingerprint the loaded model has."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import mars_cli
from mars_cli import models
from mars_cli.calibration import profiles
from mars_cli.errors import UserError
from mars_cli.models import EMBEDDED, file_fingerprint, gguf_cache_entry, model_fingerprint

from ..conftest import build_model, build_tokenizer


def save_tiny(path: Path, tied: bool, **save_options) -> Path:
    from transformers import LlamaForCausalLM

    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), seed=3)
    if tied:
        model.config.tie_word_embeddings = True
        torch.manual_seed(3)
        model = LlamaForCausalLM(model.config).eval()
        assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(path, **save_options)
    tokenizer.save_pretrained(path)
    return path


def loaded_fingerprint(path: Path, dtype: torch.dtype = torch.float32) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model_fingerprint(model, AutoTokenizer.from_pretrained(path))


def stored_keys(path: Path) -> set[str]:
    keys: set[str] = set()
    for file in path.glob("*.safetensors"):
        with safe_open(file, framework="pt") as handle:
            keys.update(handle.keys())
    return keys


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_matches_the_loaded_model(tmp_path, tied):
    path = save_tiny(tmp_path, tied)
    assert ("lm_head.weight" in stored_keys(path)) is not tied  # tied: read through embed_tokens
    expected = loaded_fingerprint(path)
    assert file_fingerprint(path) == expected
    assert loaded_fingerprint(path, torch.bfloat16) == expected


def test_large_tensors_read_by_sample(tmp_path, monkeypatch):
    path = save_tiny(tmp_path, tied=True)
    expected = file_fingerprint(path)
    monkeypatch.setattr(models.fingerprint, "_WHOLE_READ_ELEMENTS", 0)  # every tensor read element by element
    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "fresh-cache"))  # read the files again, not the remembered digest
    assert file_fingerprint(path) == expected == loaded_fingerprint(path)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_sharded_checkpoint(tmp_path, tied):
    path = save_tiny(tmp_path, tied, max_shard_size="12KB")
    assert (path / "model.safetensors.index.json").is_file()
    assert len(list(path.glob("*.safetensors"))) > 1
    assert file_fingerprint(path) == loaded_fingerprint(path)


def test_base_model_checkpoint(tmp_path):
    """A LlamaModel checkpoint (no `model.` prefix) loads into the causal LM, its head tied."""
    from transformers import LlamaModel

    tokenizer = build_tokenizer()
    config = build_model(len(tokenizer), seed=3).config
    config.tie_word_embeddings = True
    LlamaModel(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert "embed_tokens.weight" in stored_keys(tmp_path)
    assert file_fingerprint(tmp_path) == loaded_fingerprint(tmp_path)


def test_without_safetensors(tmp_path):
    path = save_tiny(tmp_path, tied=False)
    (path / "model.safetensors").unlink()
    with pytest.raises(UserError, match="no safetensors weights"):
        file_fingerprint(path)


def test_weight_missing_from_the_files(tmp_path):
    path = save_tiny(tmp_path, tied=False)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match="model.norm.weight is in no safetensors file"):
        file_fingerprint(path)


@pytest.mark.embedded
def test_embedded_smollm2(smollm2):
    converted = gguf_cache_entry(EMBEDDED["smollm2-135m"].locate_gguf())
    shipped = profiles.load(Path(mars_cli.__file__).parent / "profiles" / "smollm2-135m.yaml")
    assert file_fingerprint(converted) == smollm2.fingerprint == shipped.fingerprint


def test_a_changed_directory_is_read_again(tmp_path):
    """The digest is remembered per process only while the files stay as they were."""
    path = save_tiny(tmp_path, tied=False)
    before = file_fingerprint(path)
    tensors = load_file(path / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1.0
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    assert file_fingerprint(path) != before
