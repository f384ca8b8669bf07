"""Fixtures: tiny randomly initialised Llama-style models with a real (character-level)
tokenizer, saved as ordinary model directories so every code path, CLI included, loads them
exactly as it would a user's model. No file comes from the network."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MARS_SERVER", "off")
# the q4 kernel (decoding/kernels) is built once, where `make setup` put it, not in each test's cache
os.environ.setdefault("MARS_KERNELS", str(Path(os.environ.get("MARS_CACHE") or Path(
    os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mars-cli") / "kernels"))  # tests decode in their own process: no warm server (warm/)
# Two torch threads each; under pytest-xdist (`make test` runs a worker per core) the cores are
# shared out instead: two workers of two threads on two cores spend their time synchronising.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(2 if _WORKERS == 1 else max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))

# CI explores the same examples every run (a failure there is reproducible); locally hypothesis
# keeps exploring new ones.
from hypothesis import settings as hypothesis_settings  # noqa: E402

hypothesis_settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

CHARS = string.ascii_letters + string.digits + " .,;:!?'-\n"
SPECIALS = ["<pad>", "<s>", "</s>"]
EOS_ID = 2


def build_tokenizer(extra_tokens: int = 0):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIALS + list(CHARS))}
    for extra in range(extra_tokens):
        vocab[f"<x{extra}>"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<pad>"
    )


def build_model(vocab_size: int, seed: int, layers: int = 2, hidden: int = 32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=EOS_ID,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    # Sharpen the output layer so greedy choices are decisive (random init is near-uniform),
    # which keeps argmax ties between batched and single-token passes out of the tests.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = 0
    return model


def save_model_dir(path: Path, vocab_extra: int = 0, seed: int = 0, layers: int = 2) -> Path:
    tokenizer = build_tokenizer(vocab_extra)
    model = build_model(len(tokenizer), seed, layers)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return save_model_dir(tmp_path_factory.mktemp("tiny-target"), seed=0)


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory) -> Path:
    return save_model_dir(tmp_path_factory.mktemp("tiny-draft"), seed=1, layers=1)


@pytest.fixture(scope="session")
def tiny_other_vocab_dir(tmp_path_factory) -> Path:
    return save_model_dir(tmp_path_factory.mktemp("tiny-other-vocab"), vocab_extra=5, seed=2, layers=1)


@pytest.fixture(scope="session")
def tiny_target(tiny_dir):
    from mars_cli.models import load_model

    return load_model(str(tiny_dir), device="cpu", dtype="float32")  # the exact mode


@pytest.fixture(scope="session")
def tiny_draft(tiny_draft_dir):
    from mars_cli.models import load_model

    return load_model(str(tiny_draft_dir), device="cpu", dtype="float32")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    """Keep user profile lookups away from the developer's own files; the model cache is shared
    by the session (so the embedded model converts once), under MARS_CACHE if set."""
    monkeypatch.setenv("MARS_PROFILES", str(tmp_path_factory.getbasetemp() / "user-profiles"))
    monkeypatch.setenv("MARS_HEADS", str(tmp_path_factory.getbasetemp() / "user-heads"))


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """Speed measurements taken on a busy machine are provisional (mars_cli/tuning/machine.py
    `busy_reason`); a test suite keeps both cores busy, so tests see a quiet machine unless one
    patches `os.getloadavg` itself to test the busy case (the CPU-time sample of other processes
    reads none)."""
    from mars_cli.tuning import machine

    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(machine, "others_load", lambda seconds=machine.SAMPLE_S: 0.0)


@pytest.fixture(autouse=True)
def steady_machine(monkeypatch):
    """A session makes provisional the cached measurements its own forwards no longer match
    (mars_cli/tuning/drift.py): a loaded test machine would make that, and its note, come and go;
    tests/tuning/test_drift.py overrides this fixture."""
    from mars_cli.tuning import drift

    monkeypatch.setattr(drift, "DRIFT", float("inf"))


@pytest.fixture(autouse=True)
def exact_auto_dtype(monkeypatch):
    """`--dtype auto` measures which dtype decodes fastest here (mars_cli/tuning/dtype.py): timing
    noise would change a test's dtype, and so its outputs, from run to run, and the measurement
    would be cached in the developer's cache. In-process tests get float32 for `auto`, unmeasured
    and uncached (the exact mode); tests/tuning/test_dtype_choice.py overrides this fixture to measure."""
    from mars_cli.tuning import dtype
    from mars_cli.tuning.choice import Provenance

    def exact(target, *, fresh: bool = False, speculative: bool = False, packed: bool = False, budget=None):
        return dtype.DtypeChoice(dtype.dtype_key(target.fingerprint, target.device), "float32",
                                 [dtype.Candidate("float32", True, 1.0)], Provenance(provisional="a test"))

    monkeypatch.setattr(dtype, "choose", exact)


@pytest.fixture(autouse=True)
def dense_auto_packing(monkeypatch):
    """`--packed-weights auto` measures whether packed linears pay here (mars_cli/tuning/packing.py):
    as with the dtype, in-process tests get the dense linears for `auto`, unmeasured and uncached;
    tests/decoding/test_packing.py overrides this fixture to measure."""
    from mars_cli.tuning import packing
    from mars_cli.tuning.choice import Provenance

    monkeypatch.setattr(packing, "choose", lambda target, *, fresh=False, budget=None: packing.PackingChoice(
        False, provenance=Provenance(provisional="a test")))


@pytest.fixture(autouse=True)
def full_auto_int8_head(monkeypatch):
    """`--int8-head auto` measures whether int8 head weights pay here (mars_cli/tuning/int8.py):
    in-process tests get the head's own weights for `auto`, unmeasured and uncached;
    tests/head/test_int8_head.py overrides this fixture to measure."""
    from mars_cli.tuning import int8
    from mars_cli.tuning.choice import Provenance

    monkeypatch.setattr(int8, "choose", lambda head, target, *, fresh=False, budget=None: int8.Int8Choice(
        False, provenance=Provenance(provisional="a test")))


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist with `--dist loadgroup` (`make test`), the tests that load the embedded
    model run on one worker: it loads SmolLM2-135M once for all of them, not once a worker."""
    for item in items:
        if item.get_closest_marker("embedded") is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group("embedded"))


@pytest.fixture(scope="session")
def smollm2():
    from mars_cli.models import load_model

    return load_model("smollm2-135m", device="cpu", dtype="float32")


@pytest.fixture(autouse=True)
def fresh_measuring_budget(monkeypatch):
    """The tuning layer's measuring budget is one per process (mars_cli/tuning/clock.py): each test
    is a process of its own as far as measuring goes."""
    from mars_cli.tuning import clock

    monkeypatch.setattr(clock, "BUDGET", clock.Budget())


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A tuning cache of the test's own (never the developer's), notes said afresh (quiet_machine:
    a quiet machine). tests/tuning/test_dtype_choice.py has its own, autouse."""
    from mars_cli import notes

    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(notes, "_SHOWN", set())
    return tmp_path / "cache"


@pytest.fixture
def bf16_target(tiny_dir):
    from mars_cli.models import load_model

    return load_model(str(tiny_dir), device="cpu", dtype="bfloat16")


@pytest.fixture(autouse=True)
def no_falls_from_jitter(monkeypatch):
    """A measured cost curve that falls as the width grows is made provisional (tuning/curve.py
    `falls`): the tiny models' forwards, a millisecond or two, jitter past that line when the
    runner is shared (xdist's other worker), so tests see a measured curve as measured;
    tests/tuning/test_cache_files.py tests the rule with its own threshold."""
    from mars_cli.tuning import curve

    monkeypatch.setattr(curve, "MIN_FALL_MS", float("inf"))
