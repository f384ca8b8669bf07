"""How much KV cache each vLLM engine gets on a CPU.

vLLM's CPU backend, left alone, claims a fraction of all RAM for each engine (0.92 by default) and
refuses to start when that much is not available: on a machine whose page cache and services
hold a few GiB, even the first engine fails, and `mars eval --engine vllm` keeps one engine per
drafter. So, unless the user sized it (VLLM_CPU_KVCACHE_SPACE, --kv-cache-memory-bytes or
--gpu-memory-utilization), each engine's KV cache is sized here from the memory available at
start: what is left after each engine's weights and runtime, a share of it, divided among the
engines a run keeps, capped (a CPU decodes few sequences at once), and never below what one
sequence of the longest length needs (else one clear line says what to free or set).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError

GiB = 1 << 30
MiB = 1 << 20
KV_SHARE = 0.5  # of the memory left after the engines' weights and runtimes: the rest stays the system's
ENGINE_RUNTIME_BYTES = 3 * GiB // 2  # one engine process beside its weights: torch, vLLM, work buffers
MAX_KV_BYTES = 2 * GiB  # plenty for CPU batches: SmolLM2-135M keeps 46k float32 tokens in it
ENVIRONMENT_SETTING = "VLLM_CPU_KVCACHE_SPACE"
USER_OPTIONS = ("kv_cache_memory_bytes", "gpu_memory_utilization")  # LLM(...) names; flags with dashes
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MemoryStatus:
    """This machine's memory, as the kernel reports it (MemAvailable counts reclaimable cache)."""

    available: int
    total: int


def memory_status() -> MemoryStatus:
    """/proc/meminfo's MemAvailable and MemTotal; where there is none, free pages as available."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return MemoryStatus(int(fields["MemAvailable"].split()[0]) * 1024, int(fields["MemTotal"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        page = os.sysconf("SC_PAGE_SIZE")
        return MemoryStatus(os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page)


def user_setting(options: dict | tuple[str, ...] = ()) -> str | None:
    """What the user set to size the KV cache themselves (an LLM keyword, a `vllm serve` flag or the
    environment variable), or None."""
    if os.environ.get(ENVIRONMENT_SETTING, "") != "":
        return ENVIRONMENT_SETTING
    for name in USER_OPTIONS:
        flag = "--" + name.replace("_", "-")
        if name in options or any(word == flag or word.startswith(flag + "=") for word in options
                                  if isinstance(word, str)):
            return flag
    return None


def weights_bytes(directory: str | Path) -> int:
    """What a model directory's weights take in memory (their files' sizes), 0 for a hub id."""
    path = Path(directory)
    return sum(file.stat().st_size for file in path.glob("*.safetensors")) if path.is_dir() else 0


def kv_bytes_per_token(target_dir: str | Path, dtype: str) -> int:
    """Keys and values of one token over all layers, from the model's config.json (0 if unknown)."""
    try:
        config = json.loads((Path(target_dir) / "config.json").read_text())
        config = config.get("text_config", config)
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        kv_heads = config.get("num_key_value_heads") or heads
        width = DTYPE_BYTES.get(dtype) or DTYPE_BYTES.get(str(config.get("dtype") or config.get("torch_dtype")), 4)
        return 2 * config["num_hidden_layers"] * kv_heads * head_dim * width
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return 0


def kv_cache_bytes(engines: int, weights: int, needed: int, status: MemoryStatus) -> int:
    """Each engine's KV cache: KV_SHARE of what the engines' weights and runtimes leave of the
    available memory, split evenly, capped at MAX_KV_BYTES, in whole MiB. Raises a one-line
    UserError when that is less than `needed` (one sequence of the longest length)."""
    spare = status.available - engines * (weights + ENGINE_RUNTIME_BYTES)
    share = min(MAX_KV_BYTES, int(max(spare, 0) * KV_SHARE) // engines) // MiB * MiB
    if share < max(needed, MiB):
        raise UserError(
            f"not enough memory for {engines} vLLM engine{'s' if engines > 1 else ''} on this CPU: "
            f"{status.available / GiB:.1f} of {status.total / GiB:.1f} GiB available, each engine needs "
            f"{(weights + ENGINE_RUNTIME_BYTES) / GiB:.1f} GiB and a KV cache of at least {needed / MiB:.0f} MiB; "
            f"free memory, shorten --max-new-tokens, use fewer drafters, or set {ENVIRONMENT_SETTING}=GiB")
    return share


def describe(size: int, engines: int, status: MemoryStatus) -> str:
    """The one line that says what was chosen and how to choose otherwise."""
    each = " each" if engines > 1 else ""
    return (f"vLLM on CPU: a KV cache of {size / GiB:.2f} GiB{each} for {engines} engine{'s' if engines > 1 else ''} "
            f"({status.available / GiB:.1f} of {status.total / GiB:.1f} GiB available); set "
            f"{ENVIRONMENT_SETTING}=GiB to choose it")


def on_cpu() -> bool:
    """Whether vLLM will run on this machine's CPU: no CUDA device (vLLM's CPU build is vllm-cpu)."""
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:
        return True


def context_length(target_dir: str | Path) -> int:
    """The model's longest sequence (config.json's max_position_embeddings), 0 if unknown."""
    try:
        config = json.loads((Path(target_dir) / "config.json").read_text())
        return int(config.get("text_config", config)["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def plan_kv_cache(target_dir: str, drafter_dirs: list[str], dtype: str, max_model_len: int | None, engines: int,
                  options: dict | tuple[str, ...] = ()) -> tuple[int, str] | None:
    """The KV cache bytes each engine gets and the line that says so, or None where vLLM's own
    sizing stands (a GPU, or a size the user set). `max_model_len` None: the model's own."""
    if not on_cpu() or user_setting(options) is not None:
        return None
    status = memory_status()
    weights = weights_bytes(target_dir) + sum(weights_bytes(directory) for directory in drafter_dirs)
    needed = kv_bytes_per_token(target_dir, dtype) * (max_model_len or context_length(target_dir))
    size = kv_cache_bytes(engines, weights, needed, status)
    return size, describe(size, engines, status)


def start_failure(what: str, error: BaseException) -> UserError:
    """One line for an engine that did not start: vLLM's reason (its log above has the rest) and,
    on a CPU, the memory at hand and what to set."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    hint = ""
    if on_cpu():
        status = memory_status()
        hint = (f"; {status.available / GiB:.1f} of {status.total / GiB:.1f} GiB available now: on a CPU the usual "
                f"cause is memory: free some, or set {ENVIRONMENT_SETTING}=1 (GiB of KV cache per engine)")
    return UserError(f"vLLM's engine {what} did not start ({reason}; vLLM's log above says why){hint}")
