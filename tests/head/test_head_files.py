"""Head directories and files of any shape, through the real entry point (`mars generate --draft
head:PATH`): each malformed config value, file kind and size must be refused with exit 2 and one
line on stderr naming the file and the field, before anything is allocated and without hanging."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mars_cli.cli import main
from mars_cli.head.eagle3 import Eagle3Config, Eagle3Head
from mars_cli.head.model import FORMAT, DraftHead, HeadConfig

from .test_eagle3 import write_public_head
from .test_head import random_head


class Hung(BaseException):
    """Raised by the alarm: not an OSError, so no `except OSError` in the code under test hides it."""


@contextmanager
def deadline(seconds: int):
    """Fail a test that blocks (a FIFO opened for reading) instead of hanging the suite."""
    def expired(signum, frame):
        raise Hung(f"still running after {seconds} s: something blocked (a FIFO opened?)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def fifo_watchdog(fifo: Path, seconds: int = 30):
    """A read of `fifo` still blocked after `seconds` is let go (a writer opens and closes it, so
    the reader sees end of file) and the test fails. It is another process: a thread or a signal
    cannot help while safetensors holds the GIL in a blocked open()."""
    fired = fifo.with_name(fifo.name + ".fired")
    script = f'sleep {seconds}; : > "{fired}"; while :; do : > "{fifo}"; sleep 0.2; done'
    watchdog = subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        watchdog.kill()
        watchdog.wait()
    assert not fired.exists(), f"{fifo} was opened for reading and blocked for {seconds} s"


def refused(capsys, tiny_dir: Path, spec: str) -> str:
    """Run `mars generate` with `--draft SPEC`: exit 2, one `mars: error:` line, no traceback."""
    with deadline(120):
        code = main(["generate", "hello", "--target", str(tiny_dir), "--device", "cpu", "--draft", spec,
                     "-n", "2", "--num-draft", "2", "--draft-topk", "1"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("mars: error: "), err
    return lines[0]


@pytest.fixture()
def forbid_allocation(monkeypatch):
    """Call it once the test's files are written: from then on, building a head module fails the
    test (a head's files must be checked before its module is allocated)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a head module was allocated before its files were checked")

    def forbid() -> None:
        monkeypatch.setattr(Eagle3Head, "__init__", refuse)
        monkeypatch.setattr(DraftHead, "__init__", refuse)

    return forbid


# --------------------------------------------------------------------------- config.json values
NAN = float("nan")
BAD_CONFIGS = [
    ("eps-string", {"rms_norm_eps": "1e-6"}, "rms_norm_eps"),
    ("eps-list", {"rms_norm_eps": [1e-6]}, "rms_norm_eps"),
    ("eps-nan", {"rms_norm_eps": NAN}, "rms_norm_eps"),
    ("eps-zero", {"rms_norm_eps": 0}, "rms_norm_eps"),
    ("theta-string", {"rope_theta": "10000"}, "rope_theta"),
    ("theta-list", {"rope_theta": [10000]}, "rope_theta"),
    ("theta-negative", {"rope_theta": -1.0}, "rope_theta"),
    ("positions-string", {"max_position_embeddings": "2048"}, "max_position_embeddings"),
    ("positions-list", {"max_position_embeddings": [2048]}, "max_position_embeddings"),
    ("hidden-string", {"hidden_size": "32"}, "hidden_size"),
    ("hidden-float", {"hidden_size": 32.0}, "hidden_size"),
    ("intermediate-zero", {"intermediate_size": 0}, "intermediate_size"),
    ("heads-negative", {"num_attention_heads": -4}, "num_attention_heads"),
    ("kv-not-dividing", {"num_key_value_heads": 3}, "num_key_value_heads"),
    ("rope-scaling-string", {"rope_scaling": "linear"}, "rope_scaling"),
    ("rope-scaling-list", {"rope_scaling": [1, 2]}, "rope_scaling"),
    ("rope-type-unknown", {"rope_scaling": {"rope_type": "warp", "factor": 2.0}}, "rope_type 'warp'"),
    ("rope-llama3-incomplete", {"rope_scaling": {"rope_type": "llama3"}}, "rope_scaling"),
    ("mars-string", {"mars": "smollm2"}, "`mars`"),
    ("mars-list", {"mars": ["smollm2"]}, "`mars`"),
    ("mars-fingerprint-number", {"mars": {"target_fingerprint": 5}}, "target_fingerprint"),
    ("head-dim-negative", {"head_dim": -8}, "head_dim"),
    ("head-dim-zero", {"head_dim": 0}, "head_dim"),
    ("head-dim-odd", {"head_dim": 7}, "head_dim"),
    ("norm-before-residual-string", {"norm_before_residual": "false"}, "norm_before_residual"),
    ("eagle-config-string", {"eagle_config": "aux"}, "eagle_config"),
    ("draft-vocab-over-vocab", {"draft_vocab_size": 10_000}, "draft_vocab_size"),
]


@pytest.mark.parametrize("changes, field", [case[1:] for case in BAD_CONFIGS], ids=[case[0] for case in BAD_CONFIGS])
def test_malformed_config_values_are_one_line(capsys, tiny_dir, tiny_target, tmp_path, forbid_allocation,
                                              changes, field):
    directory = write_public_head(tmp_path / "head", tiny_target, config_changes=changes)
    forbid_allocation()
    line = refused(capsys, tiny_dir, f"head:{directory}")
    assert field in line and "config.json" in line, line


ABSURD = [("hidden", {"hidden_size": 10**9}, "hidden_size"),
          ("intermediate", {"intermediate_size": 10**9}, "intermediate_size"),
          ("draft-vocab", {"draft_vocab_size": 10**12, "vocab_size": 10**12}, "draft_vocab_size")]


@pytest.mark.parametrize("changes, field", [case[1:] for case in ABSURD], ids=[case[0] for case in ABSURD])
def test_absurd_sizes_are_refused_before_allocating(capsys, tiny_dir, tiny_target, tmp_path, forbid_allocation,
                                                    changes, field):
    """A config declaring billions of parameters is refused from the numbers alone, naming the field
    (`forbid_allocation` fails the test if the module is built first)."""
    directory = write_public_head(tmp_path / "head", tiny_target, config_changes=changes)
    forbid_allocation()
    line = refused(capsys, tiny_dir, f"head:{directory}")
    assert field in line and "config.json" in line, line


def test_shapes_are_checked_before_allocating(capsys, tiny_dir, tiny_target, tmp_path, forbid_allocation):
    """intermediate_size 200000 over 64-wide weights: the header contradicts the config, refused
    before the MLP is allocated (it used to double peak memory first)."""
    directory = write_public_head(tmp_path / "head", tiny_target, config_changes={"intermediate_size": 200_000})
    forbid_allocation()
    line = refused(capsys, tiny_dir, f"head:{directory}")
    assert "gate_proj" in line and "200000" in line, line


def test_deeply_nested_config_is_one_line(capsys, tiny_dir, tiny_target, tmp_path):
    directory = write_public_head(tmp_path / "head", tiny_target)
    depth = 100_000
    (directory / "config.json").write_text('{"extra": ' + "[" * depth + "]" * depth + "}")
    line = refused(capsys, tiny_dir, f"head:{directory}")
    assert "config.json" in line and "nested" in line, line


def test_huge_config_is_refused_unread(capsys, tiny_dir, tiny_target, tmp_path):
    directory = write_public_head(tmp_path / "head", tiny_target)
    config = json.loads((directory / "config.json").read_text())
    config["padding"] = "x" * (2 << 20)
    (directory / "config.json").write_text(json.dumps(config))
    line = refused(capsys, tiny_dir, f"head:{directory}")
    assert "config.json" in line and "larger than" in line, line


# --------------------------------------------------------------------------- files of the wrong kind
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_fifo_in_place_of_a_head_file_is_refused_without_hanging(capsys, tiny_dir, tiny_target, tmp_path, name):
    directory = write_public_head(tmp_path / "head", tiny_target)
    (directory / name).unlink()
    os.mkfifo(directory / name)
    with fifo_watchdog(directory / name):
        line = refused(capsys, tiny_dir, f"head:{directory}")
    assert name in line and "is a FIFO, not a regular file" in line, line


def test_fifo_as_a_single_file_head_is_refused_without_hanging(capsys, tiny_dir, tmp_path):
    path = tmp_path / "head.safetensors"
    os.mkfifo(path)
    with fifo_watchdog(path):
        line = refused(capsys, tiny_dir, f"head:{path}")
    assert "head.safetensors" in line and "is a FIFO, not a regular file" in line, line


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_directory_in_place_of_a_head_file_is_refused(capsys, tiny_dir, tiny_target, tmp_path, name):
    directory = write_public_head(tmp_path / "head", tiny_target)
    (directory / name).unlink()
    (directory / name).mkdir()
    line = refused(capsys, tiny_dir, f"head:{directory}")
    assert name in line and "is a directory, not a regular file" in line, line


def test_device_in_place_of_weights_is_refused(capsys, tiny_dir, tiny_target, tmp_path):
    directory = write_public_head(tmp_path / "head", tiny_target)
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors").symlink_to("/dev/zero")
    line = refused(capsys, tiny_dir, f"head:{directory}")
    assert "model.safetensors" in line and "is a device, not a regular file" in line, line


def test_empty_head_directory_names_what_is_missing(capsys, tiny_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    line = refused(capsys, tiny_dir, f"head:{tmp_path / 'empty'}")
    assert "is empty" in line and "config.json" in line and "model.safetensors" in line, line


def _header_only(header: object) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text


BAD_WEIGHTS = [
    ("garbage", b"not a safetensors file at all"),
    ("empty", b""),
    ("huge-header-length", struct.pack("<Q", 2**63) + b"{}"),
    ("header-a-list", _header_only([1, 2, 3])),
    ("offsets-past-the-end", _header_only({"fc.weight": {"dtype": "F16", "shape": [32, 96],
                                                         "data_offsets": [0, 6144]}})),
]


@pytest.mark.parametrize("content", [case[1] for case in BAD_WEIGHTS], ids=[case[0] for case in BAD_WEIGHTS])
def test_bad_safetensors_file_is_one_line(capsys, tiny_dir, tiny_target, tmp_path, content):
    directory = write_public_head(tmp_path / "head", tiny_target)
    (directory / "model.safetensors").write_bytes(content)
    line = refused(capsys, tiny_dir, f"head:{directory}")
    assert "model.safetensors" in line, line


def _rewrite_tensor(directory: Path, name: str, change) -> None:
    tensors = load_file(str(directory / "model.safetensors"))
    tensors[name] = change(tensors[name])
    save_file(tensors, str(directory / "model.safetensors"))


def test_float_d2t_is_refused(capsys, tiny_dir, tiny_target, tmp_path):
    """A float d2t was truncated to integers silently; a draft vocabulary is indices."""
    directory = write_public_head(tmp_path / "head", tiny_target)
    _rewrite_tensor(directory, "d2t", lambda d2t: d2t.float() + 0.5)
    line = refused(capsys, tiny_dir, f"head:{directory}")
    assert "d2t" in line and "integers" in line, line


def test_integer_weights_are_refused(capsys, tiny_dir, tiny_target, tmp_path):
    directory = write_public_head(tmp_path / "head", tiny_target)
    _rewrite_tensor(directory, "norm.weight", lambda weight: weight.to(torch.int64))
    line = refused(capsys, tiny_dir, f"head:{directory}")
    assert "norm.weight" in line and "floating-point" in line, line


# --------------------------------------------------------------------------- single-file heads
def _single_file(path: Path, target, config: object, **tensor_changes) -> Path:
    """A single-file head whose metadata `config` is `config` (any JSON value)."""
    tensors = {name: tensor.contiguous() for name, tensor in random_head(target).state_dict().items()}
    tensors.update(tensor_changes)
    save_file(tensors, str(path), metadata={"format": FORMAT, "config": json.dumps(config)})
    return path


def _valid_fields(target) -> dict:
    return asdict(HeadConfig.for_target(target.model, target=target.spec, target_fingerprint=target.fingerprint))


SINGLE_FILE = [
    ("config-list", lambda fields: [fields], "JSON object"),
    ("config-string", lambda fields: "hidden_size=32", "JSON object"),
    ("unknown-field", lambda fields: {**fields, "colour": "blue"}, "colour"),
    ("hidden-string", lambda fields: {**fields, "hidden_size": "32"}, "hidden_size"),
    ("heads-zero", lambda fields: {**fields, "num_heads": 0}, "num_heads"),
    ("heads-not-dividing", lambda fields: {**fields, "num_heads": 5}, "num_heads"),
    ("eps-list", lambda fields: {**fields, "rms_eps": [1e-5]}, "rms_eps"),
    ("recipe-list", lambda fields: {**fields, "recipe": []}, "recipe"),
    ("intermediate-absurd", lambda fields: {**fields, "intermediate_size": 10**9}, "intermediate_size"),
]


@pytest.mark.parametrize("make, field", [case[1:] for case in SINGLE_FILE], ids=[case[0] for case in SINGLE_FILE])
def test_single_file_head_metadata_is_checked(capsys, tiny_dir, tiny_target, tmp_path, forbid_allocation, make, field):
    path = _single_file(tmp_path / "head.safetensors", tiny_target, make(_valid_fields(tiny_target)))
    forbid_allocation()
    line = refused(capsys, tiny_dir, f"head:{path}")
    assert field in line and "head.safetensors" in line, line


def test_single_file_vocab_ids_outside_the_vocabulary(capsys, tiny_dir, tiny_target, tmp_path):
    ids = torch.arange(len(tiny_target.tokenizer))
    ids[-1] = 10_000
    path = _single_file(tmp_path / "head.safetensors", tiny_target, _valid_fields(tiny_target), vocab_ids=ids)
    line = refused(capsys, tiny_dir, f"head:{path}")
    assert "vocab_ids" in line, line


# --------------------------------------------------------------------------- the spec itself
def test_empty_head_path_is_refused_not_replaced(capsys, tiny_dir, tiny_target, tmp_path, monkeypatch):
    """`--draft head:` names no path: refused, even where a head for the target would be found."""
    heads = tmp_path / "heads"
    write_public_head(heads / "mine", tiny_target, config_changes={
        "mars": {"target": tiny_target.spec, "target_fingerprint": tiny_target.fingerprint}})
    monkeypatch.setenv("MARS_HEADS", str(heads))
    line = refused(capsys, tiny_dir, "head:")
    assert "head:" in line and "no path" in line, line


# --------------------------------------------------------------------------- what we write, and loading
@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_written_head_files_share_one_mode(tiny_target, tmp_path, mask):
    """model.safetensors gets config.json's mode (0666 less the umask), not 0600."""
    previous = os.umask(mask)
    try:
        eagle = Eagle3Head.load(write_public_head(tmp_path / "public", tiny_target))
        eagle.save_pretrained(tmp_path / "ours")
        random_head(tiny_target).save(tmp_path / "single.safetensors")
    finally:
        os.umask(previous)
    expected = 0o666 & ~mask
    for path in (tmp_path / "ours" / "config.json", tmp_path / "ours" / "model.safetensors",
                 tmp_path / "single.safetensors"):
        assert path.stat().st_mode & 0o777 == expected, (path, oct(path.stat().st_mode))


def test_declared_shapes_match_the_modules(tiny_target, tmp_path):
    """The shapes checked before allocating are exactly those the modules get."""
    eagle = Eagle3Head.load(write_public_head(tmp_path / "public", tiny_target, heads=4, kv_heads=2))
    declared = eagle.config.tensor_shapes(eagle.feature_width // 3)
    assert declared == {name: tuple(t.shape) for name, t in eagle.state_dict().items()}
    single = random_head(tiny_target)
    assert single.config.tensor_shapes(single.vocab_ids.numel()) == \
        {name: tuple(t.shape) for name, t in single.state_dict().items()}
    assert isinstance(eagle.config, Eagle3Config)


def test_valid_heads_still_load_through_the_cli(capsys, tiny_dir, tiny_target, tmp_path):
    directory = write_public_head(tmp_path / "head", tiny_target, config_changes={
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "head_dim": 8, "max_position_embeddings": None})
    with deadline(120):
        code = main(["generate", "hello", "--target", str(tiny_dir), "--device", "cpu", "--draft",
                     f"head:{directory}", "-n", "4", "--num-draft", "2", "--draft-topk", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
