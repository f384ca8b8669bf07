"""q4 among `--dtype auto`'s candidates (tuning/dtype.py, tuning/weights.py): a model read from a
GGUF whose linears hold a quantized type's codes is checked and timed in q4 like any dtype and
chosen when fastest; weights that are no file's codes are refused by the check, never quantized
afresh by `auto`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from mars_cli.decoding import kernels, quantized
from mars_cli.tuning import dtype as tuning_dtype
from mars_cli.tuning import weights as tuning_weights
from tests.conftest import save_model_dir
from tests.tuning.test_dtype_choice import auto, probe  # noqa: F401 - the fixture

pytestmark = pytest.mark.skipif(not kernels.built(), reason="no q4 kernel built here")


@pytest.fixture(autouse=True)
def exact_auto_dtype():
    """Overrides conftest's: `--dtype auto` measures here."""


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def gguf_like(tmp_path_factory, monkeypatch):
    """A tiny model whose linears hold Q4_1 codes (as a Q4_1 GGUF's dequantised weights do), taken
    for one read from a GGUF file."""
    from transformers import AutoModelForCausalLM

    path = save_model_dir(tmp_path_factory.mktemp("q4-target"), seed=0)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, torch.nn.Linear) and layer.in_features % 32 == 0:
                data = layer.weight.detach().numpy()
                kind = GGMLQuantizationType.Q4_1
                layer.weight.copy_(torch.from_numpy(dequantize(quantize(data, kind), kind).astype(np.float32)))
    model.save_pretrained(path)
    monkeypatch.setattr(tuning_dtype, "quantizable", lambda target: True)
    return path


def test_q4_is_a_candidate_and_wins_when_fastest(gguf_like, probe):  # noqa: F811
    fake = probe(float32=[10.0], bfloat16=[8.0], q4=[3.0], q4a8=[3.5])
    loaded = auto(gguf_like)
    assert fake.asked == [["float32", "q4a8", "bfloat16", "q4"]]  # the prior first: what a cut run most needs
    assert loaded.dtype_choice.chosen == "q4" and loaded.precision == "q4" and loaded.dtype == torch.float32
    assert quantized.installed(loaded.model)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        served = loaded.model(ids).logits
        quantized.remove(loaded.model)
        assert torch.allclose(served, loaded.model(ids).logits, rtol=1e-4, atol=1e-4)  # the file's own numbers


def test_q4a8_wins_when_fastest_and_its_linears_take_8_bit_activations(gguf_like, probe):  # noqa: F811
    probe(float32=[10.0], bfloat16=[8.0], q4=[3.0], q4a8=[2.0])
    loaded = auto(gguf_like)
    verdicts = {c.dtype: c for c in loaded.dtype_choice.candidates}
    assert verdicts["q4a8"].usable and verdicts["q4a8"].agreement >= tuning_dtype.MIN_AGREEMENT
    assert loaded.dtype_choice.chosen == "q4a8" and loaded.precision == "q4a8"
    forwards = [m.__dict__["forward"] for m in loaded.model.modules() if "forward" in m.__dict__]
    assert forwards and all(matrix.activations == 8 for f in forwards for matrix in f.matrices)


def test_weights_that_are_no_files_codes_are_refused(tiny_dir, probe, monkeypatch):  # noqa: F811
    monkeypatch.setattr(tuning_dtype, "quantizable", lambda target: True)
    probe(float32=[10.0], bfloat16=[8.0], q4=[3.0], q4a8=[2.0])
    loaded = auto(tiny_dir)
    verdicts = {c.dtype: c for c in loaded.dtype_choice.candidates}
    assert not verdicts["q4"].usable and "could not be recovered" in verdicts["q4"].problem
    assert not verdicts["q4a8"].usable and "could not be recovered" in verdicts["q4a8"].problem
    assert loaded.dtype_choice.chosen == "bfloat16" and not quantized.installed(loaded.model)


def test_the_real_probe_times_q4_and_leaves_float32_weights(gguf_like):
    from mars_cli.models import load_model

    target = load_model(str(gguf_like), device="cpu", dtype="float32")
    with tuning_weights.Weights(target.model) as weights:
        ms = tuning_dtype.time_steps(target, weights.use, ["float32", "q4", "q4a8"])
        assert quantized.installed(target.model) == (weights.current in ("q4", "q4a8"))
    assert set(ms) == {"float32", "q4", "q4a8"} and all(v > 0 for values in ms.values() for v in values)
    assert not quantized.installed(target.model)
    assert {p.dtype for p in target.model.parameters()} == {torch.float32}


def test_q4_is_offered_only_for_a_gguf_on_a_cpu_with_the_kernel(tiny_target):
    assert not tuning_dtype.quantizable(tiny_target)  # a model directory: no file's codes to expect
    assert tuning_dtype.candidates(torch.device("cpu"), True) == ("float32", "bfloat16", "q4", "q4a8")
    assert not {"q4", "q4a8"} & set(tuning_dtype.candidates(torch.device("cuda"), True))


@pytest.mark.parametrize("reached, chosen", [([], "q4a8"), (["float32"], "q4a8"), (["float32", "q4a8"], "q4a8"),
                                             (["float32", "q4a8", "bfloat16", "q4"], "q4")])
def test_a_first_run_cut_short_takes_q4a8_once_it_passed_its_check(gguf_like, probe, reached, chosen):  # noqa: F811
    """The newcomer's first one-liner on a GGUF: the budget runs out before the candidates are all
    timed. Where q4a8 passed its check it is the answer until a timed candidate beats it (never
    float32 because float32 happened to be timed first); a complete run weighs them all."""
    fake = probe(float32=[10.0], bfloat16=[8.0], q4=[3.0], q4a8=[3.5])
    fake.blocks = 2 if len(reached) < 4 else tuning_dtype.REPEATS
    timed = fake.__call__

    def reaching(target, use, names, deadline=None):
        return {name: times for name, times in timed(target, use, names, deadline).items() if name in reached}

    tuning_dtype.time_steps = reaching  # restored by the probe fixture's monkeypatch
    loaded = auto(gguf_like)
    assert loaded.dtype_choice.chosen == chosen and loaded.precision == chosen
    assert (loaded.dtype_choice.provenance.provisional is None) == (len(reached) == 4)
