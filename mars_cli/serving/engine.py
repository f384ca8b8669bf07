"""From `mars` names to vLLM's arguments: the target as a directory vLLM loads (an embedded GGUF
model is converted once, as `mars generate` does), a drafter as a speculative_config, and MARS
as additional_config. Used by `mars serve` (arguments for `vllm serve`, via serve.py) and
`mars eval --engine vllm` (an `LLM`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError, require

NGRAM_LOOKUP = (1, 3)  # prompt lookup n-gram sizes (min, max), as `mars generate`'s n-gram drafter


@dataclass(frozen=True)
class EngineSpec:
    """What an engine runs: the target, its drafter (`mars generate --draft` names), how many
    tokens a round drafts, and vLLM's usual knobs."""

    target: str
    draft: str = "head"
    num_draft: int = 3
    dtype: str = "float32"
    max_model_len: int = 2048
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # more LLM(...) keyword arguments


def target_directory(spec: str) -> str:
    """A directory (or hub id) vLLM can load for a `mars` model spec."""
    from ..models import gguf_cache_entry, resolve_spec

    location, gguf_name = resolve_spec(spec)
    return str(gguf_cache_entry(Path(location))) if gguf_name is not None else str(location)


def speculative_config(draft: str, target_dir: str, num_draft: int) -> dict[str, Any] | None:
    """vLLM's speculative_config for a `--draft` name (None for "none")."""
    require(1 <= num_draft <= 16, f"--num-draft must be between 1 and 16 for vLLM, got {num_draft}")
    if draft == "none":
        return None
    if draft == "ngram":
        low, high = NGRAM_LOOKUP
        return {"method": "ngram", "num_speculative_tokens": num_draft, "prompt_lookup_min": low,
                "prompt_lookup_max": high}
    if draft == "head" or draft.startswith("head:"):
        return {"method": "eagle3", "model": str(_head_directory(draft, target_dir)), "num_speculative_tokens": num_draft}
    return {"method": "draft_model", "model": target_directory(draft), "num_speculative_tokens": num_draft}


def _head_directory(draft: str, target_dir: str) -> Path:
    """An EAGLE-3 head directory: the one named, or the head made for this target."""
    from ..head.drafter import find_head
    from ..head.eagle3 import is_head_directory

    location = draft.partition(":")[2]
    if location:
        path = Path(location).expanduser()
    else:
        from ..models import file_fingerprint

        path = find_head(file_fingerprint(Path(target_dir)))
        require(path is not None, f"no draft head found for {target_dir}; train one with `mars train-head` "
                                  "(or pass --draft head:DIR)")
    require(path.exists(), f"draft head not found: {path}")
    require(is_head_directory(path), f"{path}: vLLM loads EAGLE-3 head directories (config.json and "
                                     "model.safetensors), not single-file heads")
    return path


def llm_arguments(spec: EngineSpec, mars: dict[str, Any] | None) -> dict[str, Any]:
    """The keyword arguments of vLLM's `LLM(...)` for this spec, MARS on when `mars` is given
    (settings.py's keys). Per-request acceptance counts are asked for: eval reads them."""
    target = target_directory(spec.target)
    arguments: dict[str, Any] = {
        "model": target, "dtype": spec.dtype, "max_model_len": spec.max_model_len, "seed": spec.seed,
        "speculative_config": speculative_config(spec.draft, target, spec.num_draft),
        "disable_log_stats": False, "worker_extension_cls": "mars_cli.serving.plugin.MarsWorkerExtension",
        **spec.extra,
    }
    if arguments["speculative_config"] is not None:
        arguments["per_request_spec_decode_metrics"] = "summary"
    if mars is not None:
        arguments["additional_config"] = {"mars": mars}
    return arguments


def require_vllm() -> None:
    """vLLM lives in its own environment (`make setup-vllm`): say so in one line when it is missing.
    Its logs go to stderr, not to the stdout `mars` prints results on (--json), and only its
    warnings unless VLLM_LOGGING_LEVEL says otherwise."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise UserError("vLLM is not installed in this environment: run `make setup-vllm` and use "
                        ".venv-vllm/bin/mars (or pip install 'mars-cli[vllm]')") from None


def build_llm(spec: EngineSpec, mars: dict[str, Any] | None):
    """vLLM's `LLM` for this spec. Its engine runs in processes of its own (vLLM's default, and
    the only way two engines live in one program on vLLM's CPU build); the plugin there is
    reached through `collective_rpc("mars_counters")` and `collective_rpc("mars_set_thresholds")`."""
    require_vllm()
    from vllm import LLM

    return LLM(**llm_arguments(spec, mars))
