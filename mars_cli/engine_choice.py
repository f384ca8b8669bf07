"""`--engine auto`, `mars generate`'s default: the engine whose default session decodes fastest on
this machine, where both could serve the request.

Only llama.cpp (`--engine llama.cpp`, `make setup-llamacpp`) and our transformers engine differ
here, and only for a GGUF target on the CPU with options llama.cpp can take (no draft head, no
explicit dtype, compile or device map). Then both sessions are built once and decode the same
prompt, interleaved, and the faster median wins; the verdict is cached under `<cache>/engine/`
(keyed by the GGUF's hash, the machine, the drafter and llama-cpp-python's version), and taken
again when it was measured on a busy machine. Everywhere else `auto` is transformers, with the
reason in `--json`'s `config.engine_choice` and `--stats`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .notes import note
from .options import DecodingOptions

if TYPE_CHECKING:
    from .session import Session

AUTO = "auto"
ENGINES = ("transformers", "llama.cpp")
FOLDER = "engine"  # <cache>/engine/<hash of the key>.json
SCHEMA = 1
TOKENS = 32  # new tokens a timed decode produces
ROUNDS = 3  # timed decodes per engine, interleaved, after one untimed warm-up each
PROMPT = "Explain in two sentences why the sky is blue."


@dataclass
class EngineChoice:
    """Which engine serves `--engine auto`, why, and the rates it was chosen on."""

    engine: str
    why: str
    tok_s: dict[str, float] = field(default_factory=dict)  # median tokens/s by engine, where measured
    cached: bool = False
    provisional: str | None = None  # measured on a busy machine: measured again once it is quiet

    def report(self) -> dict:
        return asdict(self)


def llamacpp_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def transformers_only(options: DecodingOptions) -> str | None:
    """Why only the transformers engine can serve `options` (one phrase), or None."""
    from .models.loading import resolve_spec

    model, draft = options.model, options.drafting.draft
    if not llamacpp_installed():
        return "llama-cpp-python is not installed here (make setup-llamacpp)"
    try:
        _, gguf_name = resolve_spec(model.target)
    except Exception:  # noqa: BLE001 - a bad spec is refused in one line when it loads
        return "the target is not a GGUF file"
    if gguf_name is None:
        return "the target is not a GGUF file"
    if model.device not in ("auto", "cpu") or model.device_map:
        return "llama.cpp runs on the CPU only"
    if model.dtype != "auto":
        return f"--dtype {model.dtype} is a transformers dtype"
    if model.compile == "on":
        return "--compile on compiles transformers forwards"
    if draft == "head" or draft.startswith("head:"):
        return "a draft head reads hidden states llama.cpp does not hand over"
    return None


def resolve(options: DecodingOptions, build: Callable[[DecodingOptions], "Session"]) -> tuple[DecodingOptions, "Session | None", EngineChoice | None]:
    """`options` with a concrete engine, the session measuring built for it (None where nothing was
    built), and the choice (None where `--engine` named one)."""
    if options.model.engine != AUTO:
        return options, None, None
    why = transformers_only(options)
    if why is not None:
        return options.replace(engine="transformers"), None, EngineChoice("transformers", why)
    key = choice_key(options)
    path = entry_path(key)
    cached = read(path, key)
    if cached is not None and not (cached.provisional and _quiet()):
        return options.replace(engine=cached.engine), None, cached
    sessions, refused = built_sessions(options, build)
    if refused is not None:  # one engine cannot load this target: the other serves (not cached)
        engine = next(iter(sessions))
        return options.replace(engine=engine), sessions[engine], EngineChoice(engine, refused)
    choice = measure(sessions)
    save(path, key, choice)
    note(f"--engine auto: {describe(choice)}; cached for later runs", once=True)
    return options.replace(engine=choice.engine), sessions[choice.engine], choice


def built_sessions(options: DecodingOptions, build: Callable[[DecodingOptions], "Session"]) -> tuple[dict, str | None]:
    """Both engines' default sessions; where one cannot be built (an architecture llama.cpp or
    transformers does not know), the other alone with the reason. Raises where neither can."""
    from .errors import UserError

    sessions: dict = {}
    failures: dict[str, UserError] = {}
    for engine in ENGINES:
        try:
            sessions[engine] = build(options.replace(engine=engine))
        except UserError as exc:
            failures[engine] = exc
    if not sessions:
        raise failures["transformers"]
    if failures:
        engine, exc = next(iter(failures.items()))
        return sessions, f"{engine} cannot serve this target ({exc})"
    return sessions, None


def choice_key(options: DecodingOptions) -> dict:
    """What the verdict depends on: the GGUF file, this machine, the drafter and llama.cpp's build."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    from .models.identity import file_sha256
    from .models.loading import resolve_spec
    from .tuning.machine import machine_key

    location, _ = resolve_spec(options.model.target)
    try:
        binding = version("llama-cpp-python")
    except PackageNotFoundError:
        binding = "unknown"
    return {**machine_key(file_sha256(Path(location)), torch.device("cpu")), "draft": options.drafting.draft,
            "verify": options.verification.verify, "llama_cpp_python": binding}


def entry_path(key: dict) -> Path:
    from .tuning.store import cache_path

    return cache_path(key, FOLDER)


def read(path: Path, key: dict) -> EngineChoice | None:
    """The cached verdict for `key`, or None where there is none or it is malformed."""
    from .tuning.store import read_entry

    data = read_entry(path, SCHEMA, key)
    try:
        if data is None or data["engine"] not in ENGINES or not isinstance(data["why"], str):
            return None
        rates = {name: float(rate) for name, rate in data["tok_s"].items() if name in ENGINES}
        provisional = data.get("provisional")
        return EngineChoice(data["engine"], data["why"], rates, cached=True,
                            provisional=provisional if isinstance(provisional, str) else None)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def save(path: Path, key: dict, choice: EngineChoice) -> None:
    from .tuning.store import save_or_note

    entry = {"schema": SCHEMA, "key": key, "engine": choice.engine, "why": choice.why, "tok_s": choice.tok_s,
             "provisional": choice.provisional}
    save_or_note(path, json.dumps(entry, indent=1), "the engine choice")


def measure(sessions: dict[str, "Session"]) -> EngineChoice:
    """Both engines' default sessions decode PROMPT for TOKENS tokens, ROUNDS times each,
    interleaved after a warm-up; the faster median wins (transformers on a tie)."""
    rates: dict[str, list[float]] = {engine: [] for engine in ENGINES}
    for round_ in range(ROUNDS + 1):
        for engine, session in sessions.items():
            rate = timed_rate(session)
            if round_ > 0:  # the first round warms each engine up
                rates[engine].append(rate)
    medians = {engine: statistics.median(values) for engine, values in rates.items()}
    fastest = "llama.cpp" if medians["llama.cpp"] > medians["transformers"] else "transformers"
    why = (f"decoded fastest here: {medians['llama.cpp']:.1f} tok/s on llama.cpp, "
           f"{medians['transformers']:.1f} on transformers")
    return EngineChoice(fastest, why, medians, provisional=_busy())


def timed_rate(session: "Session") -> float:
    """Tokens/s of one decode of PROMPT with `session`, TOKENS new tokens at most."""
    settings = dataclasses.replace(session.settings(), max_new_tokens=TOKENS)
    stats = session.run(PROMPT, settings=settings).stats
    return stats.new_tokens / stats.wall_s if stats.wall_s > 0 else 0.0


def describe(choice: EngineChoice) -> str:
    return f"{choice.engine} ({choice.why})"


def _busy() -> str | None:
    from .tuning.machine import busy_reason

    return busy_reason()


def _quiet() -> bool:
    return _busy() is None
