"""The error matrix's fixtures (tests/cli/test_errors_*.py): broken inputs of every kind, and
refusals that must come before any model loads."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture()
def files(tmp_path, tiny_dir):
    """Broken inputs of every kind, made fresh for each test."""
    made = {}
    made["empty_gguf"] = tmp_path / "empty.gguf"
    made["empty_gguf"].write_bytes(b"")
    made["truncated_gguf"] = tmp_path / "truncated.gguf"
    made["truncated_gguf"].write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x01" * 10)
    truncated_dir = tmp_path / "truncated-safetensors"
    shutil.copytree(tiny_dir, truncated_dir)
    weights = truncated_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])
    made["truncated_dir"] = truncated_dir
    pickle_dir = tmp_path / "pickle-only"
    shutil.copytree(tiny_dir, pickle_dir)
    from safetensors.torch import load_file
    import torch

    torch.save(load_file(pickle_dir / "model.safetensors"), pickle_dir / "pytorch_model.bin")
    (pickle_dir / "model.safetensors").unlink()
    made["pickle_dir"] = pickle_dir
    made["bad_yaml"] = tmp_path / "bad.yaml"
    made["bad_yaml"].write_text("schema: 1\nmodel: [unclosed\n")
    made["empty_yaml"] = tmp_path / "empty.yaml"
    made["empty_yaml"].write_text("")
    made["bad_jsonl"] = tmp_path / "bad.jsonl"
    made["bad_jsonl"].write_text('{"prompt": "fine"}\n{"prompt": "also fine"}\n{"prompt": oops}\n')
    made["a_file"] = tmp_path / "plain-file"
    made["a_file"].write_text("not a directory")
    return made


# ----------------------------------------------------------------------------- issue 24, item 5
@pytest.fixture()
def no_model(monkeypatch):
    """These refusals must come before any model loads (one took 38 s): loading fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr("mars_cli.models.load_model", refuse)
