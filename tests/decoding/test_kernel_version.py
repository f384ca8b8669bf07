"""Measured choices on the quantized modes (dtype entries, cost curves) are keyed by the kernels'
VERSION, not their source text, so a refactor keeps a machine's `mars tune`. The price: a change
of a kernel's arithmetic must bump VERSION. This test holds the kernels' outputs on fixed inputs
to the digest recorded for the current VERSION (tests/data/kernel_numbers.json), and fails when
they change while VERSION does not."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mars_cli.decoding import kernels

RECORD = Path(__file__).resolve().parents[1] / "data" / "kernel_numbers.json"

pytestmark = pytest.mark.skipif(kernels.problem() is not None, reason="this project's kernels are not built here")


def fixed(shape: tuple[int, ...], low: int, high: int, seed: int) -> np.ndarray:
    """Integers from numpy's seeded generator (the same on every machine), as given."""
    return np.random.default_rng(seed).integers(low, high, size=shape)


def outputs() -> list[torch.Tensor]:
    """Every product on fixed inputs: both kernels, 4- and 8-bit codes, one row and tiles of rows
    (1, 3, 9, 17: the one-row path, a partial and full tiles), an even and an odd count of groups;
    the norm and the gating."""
    found = []
    for seed, (in_features, bits) in enumerate([(576, 4), (96, 4), (576, 8), (96, 8)]):
        out_features = 20
        levels = 16 if bits == 4 else 256
        codes = torch.from_numpy(fixed((out_features, in_features), 0, levels, seed)).to(torch.uint8)
        if bits == 4:  # two codes a byte: j and j + 16 of a group
            halves = codes.reshape(out_features, -1, 2, 16)
            codes = (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(out_features, -1)
        groups = (out_features, in_features // 32)
        scale = torch.from_numpy(fixed(groups, 1, 1000, seed + 10) / 2.0 ** 17).float()
        offset = torch.from_numpy(fixed(groups, -1000, 1000, seed + 20) / 2.0 ** 14).float()
        for rows in (1, 3, 9, 17):
            x = torch.from_numpy(fixed((rows, in_features), -4000, 4000, seed + rows) / 997.0).float()
            for op in (torch.ops.mars.quantized_linear, torch.ops.mars.quantized_linear_a8):
                found.append(op(x, codes.contiguous(), scale, offset, bits, None))
    x = torch.from_numpy(fixed((5, 576), -4000, 4000, 99) / 997.0).float()
    weight = torch.from_numpy(fixed((576,), 500, 1500, 98) / 1000.0).float()
    found.append(torch.ops.mars.rms_norm(x, weight, 1e-5))
    found.append(torch.ops.mars.silu_mul(torch.cat([x, x.flip(-1)], dim=-1)))
    return found


def digest() -> str:
    hashing = hashlib.sha256()
    for tensor in outputs():
        hashing.update(tensor.contiguous().numpy().tobytes())
    return hashing.hexdigest()[:16]


def test_the_kernels_numbers_change_only_with_their_version():
    recorded = json.loads(RECORD.read_text())
    now = digest()
    assert str(kernels.VERSION) in recorded, (
        f"kernels.VERSION {kernels.VERSION} has no digest in {RECORD.name}: record {now!r} for it")
    assert recorded[str(kernels.VERSION)] == now, (
        f"the kernels' outputs changed (digest {now}, recorded {recorded[str(kernels.VERSION)]} for version "
        f"{kernels.VERSION}): bump kernels.VERSION and record the new digest, so that measured choices are measured anew")


def test_measured_choices_are_keyed_by_the_version_not_the_source(monkeypatch):
    from mars_cli.tuning import dtype as tuning_dtype

    key = tuning_dtype.dtype_key("model", torch.device("cpu"), quantizable=True)
    assert key["kernels"] == kernels.version() and str(kernels.VERSION) in key["kernels"]
    kernels.stamp.cache_clear()
    monkeypatch.setattr(kernels, "SOURCES", kernels.SOURCES[:1])  # another text: another build, the same key
    assert kernels.stamp() != key["kernels"] and tuning_dtype.dtype_key("model", torch.device("cpu"), quantizable=True) == key
    kernels.stamp.cache_clear()
