"""Device and dtype flags -> torch devices and dtypes."""

from __future__ import annotations

import torch

from ..errors import require
from ..notes import note


def resolve_device(name: str) -> torch.device:
    """`auto` picks cuda, then mps, then cpu; asking for an absent accelerator is an error."""
    name = name.lower()
    has_mps = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if has_mps else "cpu")
    if name.startswith("cuda"):
        require(torch.cuda.is_available(), f"--device {name}: no CUDA device is available here")
        return torch.device(name)
    if name == "mps":
        require(has_mps, "--device mps: no Apple MPS device is available here")
        return torch.device("mps")
    require(name == "cpu", f"--device {name}: expected auto, cpu, cuda, cuda:N or mps")
    return torch.device("cpu")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_computes_bfloat16() -> bool:
    """Whether this CPU has native bfloat16 arithmetic: AVX512-BF16 or AMX tiles on x86 (as torch
    reports them), BF16 on Arm (as oneDNN reports it). Elsewhere bfloat16 is converted in software,
    which may be slower or faster than float32 (it halves the memory read: on this project's AVX2
    CPU plain decoding ran 1.45x faster in bfloat16). `--dtype auto` does not read it: it measures
    (tuning/dtype.py); head training's `--bfloat16 auto` does."""
    import platform

    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        check = getattr(torch.cpu, probe, None)
        if check is not None and check():
            return True
    if platform.machine().lower() in ("aarch64", "arm64"):
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def resolve_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """An explicit `--dtype`'s torch dtype; None for `auto`, which is measured once the model is
    loaded: the dtype whose plain decoding steps run fastest on this machine among those whose
    output is usable (tuning/dtype.py; cached). `--dtype float32` is the exact mode; an explicit
    dtype is never measured."""
    if name == "auto":
        return None
    require(name in DTYPES, f"--dtype {name}: expected auto, float32, bfloat16, float16, q4 or q4a8")
    if name == "bfloat16" and device.type == "cpu" and not cpu_computes_bfloat16():
        note("this CPU has no native bfloat16 instructions: --dtype bfloat16 may be slower or faster than float32 "
             "here (`mars profile --dtypes` measures both; --dtype auto chooses by that measurement)", once=True)
    return DTYPES[name]


def unmeasured_auto_dtype(device: torch.device) -> torch.dtype:
    """`--dtype auto` with `--device-map`: a model spread over devices may not fit them in float32,
    which measuring starts from, so it loads in bfloat16 on CUDA (float32 elsewhere), unmeasured."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32
