"""Model specs, devices, dtypes, the GGUF conversion cache and device_map placement."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from mars_cli import models
from mars_cli.errors import UserError
from mars_cli.models import cache_entry_is_valid, load_model, resolve_device, resolve_dtype, resolve_spec


def test_auto_device_and_dtype():
    expected = "cuda" if torch.cuda.is_available() else ("cpu", "mps")
    assert resolve_device("auto").type in expected
    assert resolve_dtype("auto", torch.device("cuda")) is None  # measured once loaded (tests/tuning/test_dtype_choice.py)
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    assert resolve_dtype("float32", torch.device("cpu")) == torch.float32
    assert models.unmeasured_auto_dtype(torch.device("cuda")) == torch.bfloat16  # --device-map: not measured
    assert models.unmeasured_auto_dtype(torch.device("cpu")) == torch.float32


def test_auto_dtype_never_reads_the_cpu_flag(monkeypatch):
    """Issue 26: which dtype decodes fastest is measured; "native bf16 instructions" was the wrong test."""
    def refuse() -> bool:
        raise AssertionError("--dtype auto read the CPU flag")

    monkeypatch.setattr(models.device, "cpu_computes_bfloat16", refuse)
    assert resolve_dtype("auto", torch.device("cpu")) is None


def test_cpu_probe_reads_what_torch_reports(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert models.cpu_computes_bfloat16()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    assert not models.cpu_computes_bfloat16()


def test_bfloat16_without_native_instructions_notes_in_one_line(monkeypatch, capsys):
    from mars_cli import notes

    monkeypatch.setattr(notes, "_SHOWN", set())  # said once per process: an earlier test may have said it
    monkeypatch.setattr(models.device, "cpu_computes_bfloat16", lambda: False)
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16  # a draft model: not said twice
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "no native bfloat16" in lines[0] and "may be slower or faster" in lines[0]


def test_missing_accelerator_is_a_clear_error():
    if torch.cuda.is_available():
        assert resolve_device("cuda").type == "cuda"
    else:
        with pytest.raises(UserError, match="no CUDA device"):
            resolve_device("cuda")
    with pytest.raises(UserError, match="expected auto"):
        resolve_device("tpu")
    with pytest.raises(UserError, match="--dtype"):
        resolve_dtype("int3", torch.device("cpu"))


def test_spec_errors_name_the_problem(tmp_path):
    with pytest.raises(UserError, match="smollm2-135m"):
        resolve_spec("no-such-model")
    with pytest.raises(UserError, match="not found"):
        resolve_spec(str(tmp_path / "missing.gguf"))
    with pytest.raises(UserError, match="no config.json"):
        resolve_spec(str(tmp_path))
    assert resolve_spec("HuggingFaceTB/SmolLM2-135M-Instruct") == ("HuggingFaceTB/SmolLM2-135M-Instruct", None)


def test_corrupt_gguf_gives_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(UserError, match="cannot load model"):
        load_model(str(bad), device="cpu")
    assert not any((tmp_path / "cache" / "models").glob("*")), "a failed conversion left files behind"


def test_cache_entry_validation_detects_truncation_and_corruption(tmp_path):
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "model.safetensors").write_bytes(b"x" * 1000)
    (entry / "config.json").write_text("{}")
    manifest = {"format": models.CACHE_FORMAT, "files": models.gguf_cache._manifest(entry)}
    (entry / "manifest.json").write_text(json.dumps(manifest))
    assert cache_entry_is_valid(entry)
    (entry / "model.safetensors").write_bytes(b"x" * 999)
    assert not cache_entry_is_valid(entry)
    (entry / "model.safetensors").write_bytes(b"y" * 1000)
    assert not cache_entry_is_valid(entry)
    (entry / "manifest.json").unlink()
    assert not cache_entry_is_valid(entry)


def test_loads_a_model_directory(tiny_target):
    assert tiny_target.dtype == torch.float32
    assert tiny_target.eos_token_ids == {2}
    assert tiny_target.context_window == 256


def test_device_map_auto_path_decodes_like_plain_load(tiny_dir, tiny_target, monkeypatch):
    """On one CPU accelerate places everything on it; the test checks the path end to end."""
    from transformers import AutoModelForCausalLM

    from mars_cli.options import DecodingOptions
    from mars_cli.session import Session

    seen = {}
    original = AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.update(kwargs)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    mapped = load_model(str(tiny_dir), device="cpu", device_map="auto")
    assert seen.get("device_map") == "auto"
    assert mapped.device.type == "cpu" and mapped.output_device.type == "cpu"
    options = DecodingOptions.of(target=str(tiny_dir), max_new_tokens=12, device="cpu")
    a = Session(options, target=mapped).run([4, 5, 6]).token_ids
    b = Session(options, target=tiny_target).run([4, 5, 6]).token_ids
    assert a == b


@pytest.mark.embedded
def test_embedded_model_cache_is_reused_and_rebuilt_when_corrupt(tmp_path, monkeypatch, smollm2):
    # a private cache so the test can corrupt it without touching the shared one
    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    first = load_model("smollm2-135m", device="cpu")
    entry = next((tmp_path / "models").iterdir())
    stamp = (entry / "model.safetensors").stat().st_mtime_ns
    again = load_model("smollm2-135m", device="cpu")
    assert (entry / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not reconverted
    # a partial entry: replace the weights by a truncated copy (a new file, since the loaded
    # models still map the old one's pages)
    weights = entry / "model.safetensors"
    partial = weights.read_bytes()[:1024]
    weights.unlink()
    weights.write_bytes(partial)
    rebuilt = load_model("smollm2-135m", device="cpu")
    assert cache_entry_is_valid(entry)
    weight = rebuilt.model.get_input_embeddings().weight
    assert torch.equal(weight, first.model.get_input_embeddings().weight)
    assert torch.equal(again.model.get_input_embeddings().weight, weight)


def test_fingerprint_is_stable_across_dtype_and_changes_with_weights(tiny_dir):
    import copy

    from mars_cli.models import model_fingerprint

    fp32 = load_model(str(tiny_dir), device="cpu")
    bf16 = load_model(str(tiny_dir), device="cpu", dtype="bfloat16")
    assert fp32.fingerprint == bf16.fingerprint
    changed = copy.deepcopy(fp32.model)
    with torch.no_grad():
        changed.lm_head.weight[-1, -1] += 1.0  # the last element of a tensor is always sampled
    assert model_fingerprint(changed, fp32.tokenizer) != fp32.fingerprint
    with torch.no_grad():
        big = torch.nn.Linear(4096, 7000, bias=False)  # float32 index rounding once broke this size
        big.weight.zero_()
    model_fingerprint(big, fp32.tokenizer)


# --------------------------------------------------------------------------- concurrent first use
FAKE_CONVERTER = """
import sys, time
from pathlib import Path
from mars_cli import models

def slow_dequantise(gguf_path, staging):
    with open(sys.argv[2], "a") as log:
        log.write("converted\\n")
    time.sleep(1.0)  # long enough for the other process to reach its own conversion
    (staging / "model.safetensors").write_bytes(b"w" * 4096)
    (staging / "config.json").write_text("{}")

models.gguf_cache._check_gguf = lambda path: None
models.gguf_cache._dequantise = slow_dequantise
print(models.gguf_cache_entry(Path(sys.argv[1])))
"""


def test_two_processes_converting_into_an_empty_cache_both_succeed(tmp_path):
    """The loser waits on the lock and uses the winner's entry (before: `Directory not empty`)."""
    import subprocess
    import sys

    gguf, log = tmp_path / "tiny.gguf", tmp_path / "conversions.log"
    gguf.write_bytes(os.urandom(1024))
    env = dict(os.environ, MARS_CACHE=str(tmp_path / "cache"))
    runs = [subprocess.Popen([sys.executable, "-c", FAKE_CONVERTER, str(gguf), str(log)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [run.communicate(timeout=60) + (run.returncode,) for run in runs]
    assert [code for _, _, code in results] == [0, 0], results
    entries = {out.strip() for out, _, _ in results}
    assert len(entries) == 1 and cache_entry_is_valid(Path(entries.pop()))
    assert log.read_text().count("converted") == 1  # converted once, reused by the other
    assert not list((tmp_path / "cache" / "models").glob("*.tmp-*"))


def test_stale_conversion_temporaries_are_removed_unless_a_live_process_owns_them(tmp_path, monkeypatch):
    import fcntl

    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(os.urandom(1024))
    entry_name = f"gguf-{models.file_sha256(gguf)[:32]}"
    root = tmp_path / "cache" / "models"
    mine, dead_other, live_other = (root / f"{entry_name}.tmp-killed", root / "gguf-other.tmp-killed",
                                    root / "gguf-busy.tmp-working")
    for directory in (mine, dead_other, live_other):
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(b"x" * 1000)
    locks = tmp_path / "cache" / "locks"
    locks.mkdir()
    held = open(locks / "gguf-busy.lock", "a+b")  # a live conversion of another model
    fcntl.flock(held, fcntl.LOCK_EX)

    def dequantise(gguf_path, staging):
        (staging / "config.json").write_text("{}")

    monkeypatch.setattr(models.gguf_cache, "_check_gguf", lambda path: None)
    monkeypatch.setattr(models.gguf_cache, "_dequantise", dequantise)
    entry = models.gguf_cache_entry(gguf)
    held.close()
    assert cache_entry_is_valid(entry)
    assert not mine.exists() and not dead_other.exists()  # left by killed conversions
    assert live_other.is_dir()  # its converter is alive: untouched


def test_model_facts_read_the_text_config_and_both_rope_layouts(tiny_target):
    """Facts come from the language model's config, nested (multimodal) or not, and RoPE's base
    from `rope_parameters` (transformers 5) or `rope_theta` (before), 10000 when neither is set."""
    from types import SimpleNamespace

    config = tiny_target.model.config
    assert tiny_target.text_config is config
    assert (tiny_target.hidden_size, tiny_target.num_layers) == (config.hidden_size, config.num_hidden_layers)
    assert tiny_target.vocab_size == tiny_target.model.get_output_embeddings().weight.shape[0]
    text = SimpleNamespace(hidden_size=8, num_hidden_layers=3, rope_parameters={"rope_theta": 5e5})
    nested = SimpleNamespace(config=SimpleNamespace(text_config=text))
    assert models.text_config(nested) is text
    assert (models.hidden_size(nested), models.num_layers(nested), models.rope_theta(nested)) == (8, 3, 5e5)
    assert models.rope_theta(SimpleNamespace(config=SimpleNamespace(rope_theta=1e4 / 2))) == 5000.0
    assert models.rope_theta(SimpleNamespace(config=SimpleNamespace())) == 10000.0


# --------------------------------------------------------------------------- converted once per dtype
def test_a_dtype_conversion_is_stored_once_and_read_bit_for_bit(tmp_path, tiny_dir, monkeypatch):
    """models.convert_weights: the first conversion casts and stores the copy, the next process's
    reads it (no cast) with the very same bits; a copy that does not fit is cast again."""
    from mars_cli.models import loading

    first = load_model(str(tiny_dir), device="cpu", dtype="float32")
    first.converted_copies = tmp_path / "dtypes"
    loading.convert_weights(first, torch.bfloat16)
    copy = tmp_path / "dtypes" / "bfloat16.safetensors"
    assert copy.is_file() and first.model.config.dtype == torch.bfloat16

    def refuse(model, dtype):
        raise AssertionError("cast again although a converted copy is stored")

    second = load_model(str(tiny_dir), device="cpu", dtype="float32")
    second.converted_copies = tmp_path / "dtypes"
    monkeypatch.setattr(loading, "cast_parameters", refuse)
    loading.convert_weights(second, torch.bfloat16)
    for (name, a), (_, b) in zip(first.model.named_parameters(), second.model.named_parameters()):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert second.model.config.dtype == torch.bfloat16
    monkeypatch.undo()

    copy.write_bytes(copy.read_bytes()[:100])  # a torn copy: cast again, and stored whole again
    third = load_model(str(tiny_dir), device="cpu", dtype="float32")
    third.converted_copies = tmp_path / "dtypes"
    loading.convert_weights(third, torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(first.model.parameters(), third.model.parameters()))
    assert copy.stat().st_size > 100 and not list((tmp_path / "dtypes").glob("*.tmp-*"))


@pytest.mark.embedded
def test_a_gguf_model_keeps_its_converted_copies_in_its_cache_entry(smollm2):
    assert smollm2.converted_copies == smollm2.directory / "dtypes"
    assert smollm2.directory.parent.name == "models" and smollm2.directory.name.startswith("gguf-")
