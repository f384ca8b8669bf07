"""`mars serve`: vLLM's OpenAI-compatible server (`vllm serve`) for a target and a drafter, MARS on.

Everything `mars` decides is settled here, in this process, before vLLM starts: the target as a
directory vLLM loads (an embedded GGUF model converted once, engine.target_directory), the drafter
as a speculative_config, and the "mars" mapping resolved (settings.resolve: the theta given, or the
profile's). Bad input is one line and exit 2, not a stack trace a minute into vLLM's start-up. Then
this process becomes `vllm serve` (exec), the resolved mapping in --additional-config, so no vLLM
process looks for profiles or fingerprints again. Flags mars does not know pass through unchanged.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from ..errors import UserError, check_seed, require
from ..options import VerifyOptions
from . import engine, memory, settings

DTYPES = ("auto", "float32", "bfloat16", "float16")  # `mars generate`'s names, all also vLLM's
DEFAULT_DRAFT = "head"
DEFAULT_NUM_DRAFT = 3
DEFAULT_HOST = "127.0.0.1"  # this machine only: vLLM alone would bind every interface, with no key
DEFAULT_PORT = 8000  # vLLM's
# vLLM flags `mars serve` writes itself (from --draft/--num-draft, and the resolved "mars" mapping)
OWNED_FLAGS = {"--speculative-config": "--draft and --num-draft", "-sc": "--draft and --num-draft",
               "--host": "--host (before --)", "--port": "--port (before --)",
               "--additional-config": "--verify, --threshold, --calibration, --margin and --force"}
# settings.py words its errors for additional_config; `mars serve` users typed flags
IN_FLAG_TERMS = (('add "force": true', "pass --force"),
                 ('give "profile" a path or "theta" a value', "pass --calibration PROFILE or --threshold THETA"))


@dataclass(frozen=True)
class ServeRequest:
    """What `mars serve` was asked for, by its flags' names."""

    target: str
    draft: str = DEFAULT_DRAFT
    num_draft: int = DEFAULT_NUM_DRAFT
    verification: VerifyOptions = field(default_factory=lambda: VerifyOptions(verify="mars"))
    dtype: str = "auto"
    max_model_len: int | None = None  # None: vLLM's default, the model's context length
    seed: int | None = None  # None: vLLM's default (0)
    passthrough: tuple[str, ...] = ()  # for `vllm serve`, in the order given
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT

    def validate(self) -> None:
        """The checks that need no model: each bad flag is one sentence."""
        verification = self.verification
        verification.validate()
        require(self.draft != "auto", "--draft auto is `mars generate`'s; `mars serve` takes head (the default), "
                                      "head:DIR, ngram, none or a draft model spec")
        require(self.dtype in DTYPES, f"--dtype {self.dtype}: expected {', '.join(DTYPES)}")
        require(self.max_model_len is None or self.max_model_len >= 1,
                f"--max-model-len must be at least 1, got {self.max_model_len}")
        check_seed(self.seed)
        require(self.host.strip() != "", "--host must name an address (0.0.0.0 for every interface)")
        require(1 <= self.port <= 65535, f"--port must be between 1 and 65535, got {self.port}")
        if verification.verify == "strict":
            given = [flag for flag, value in (("--threshold", verification.threshold),
                                              ("--calibration", verification.calibration)) if value is not None]
            require(not given, f"{given[0] if given else ''} sets MARS's threshold, but --verify strict has none: "
                               "drop it or use --verify mars")
        else:
            require(self.draft != "none", "--verify mars relaxes the verification of drafts, but --draft none drafts "
                                          "nothing: pick a drafter (head, head:DIR, ngram or a draft model) or "
                                          "--verify strict")
        for argument in self.passthrough:
            name = argument.split("=", 1)[0].split(".", 1)[0].replace("_", "-")
            require(name not in OWNED_FLAGS, f"{name} is what `mars serve` writes from {OWNED_FLAGS.get(name)}; "
                                             "use those, or run the `vllm serve` command --dry-run prints, edited")


@dataclass(frozen=True)
class ServePlan:
    """What `vllm serve` will run with, every choice resolved."""

    target: str  # as given
    target_dir: str  # what vLLM loads
    speculative: dict[str, Any] | None
    mars: dict[str, Any] | None  # resolved (settings.RESOLVED)
    arguments: tuple[str, ...]  # after the program: ("serve", target_dir, ...)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: bool = False  # whether requests must carry a key (--api-key, or VLLM_API_KEY set)
    kv_cache: str | None = None  # on a CPU, what memory.py chose for the KV cache (None: vLLM's own sizing)

    def choices(self) -> list[str]:
        """One line per choice, for stderr."""
        target = self.target_dir if self.target_dir == self.target else f"{self.target_dir} ({self.target})"
        drafter = json.dumps(self.speculative) if self.speculative is not None else "none (--draft none)"
        rule = settings.describe(self.mars) if self.mars is not None else \
            "MARS off: --verify strict, vLLM's own (lossless) verification"
        where = "this machine only" if is_loopback(self.host) else "reachable from other machines"
        key = "an API key required" if self.api_key else "no API key"
        return [f"target: {target}", f"speculative config: {drafter}", rule,
                f"listening on: http://{_bracketed(self.host)}:{self.port} ({where}, {key})",
                *([self.kv_cache] if self.kv_cache else [])]

    def exposure(self) -> str | None:
        """The warning line for a server others can reach with no key, else None."""
        if is_loopback(self.host) or self.api_key:
            return None
        return (f"--host {self.host} serves the API to every machine that can reach this one, with no key: "
                "pass --api-key KEY (or set VLLM_API_KEY), or leave out --host to listen on 127.0.0.1 only")

    def shell(self) -> str:
        """The command, quoted for a shell."""
        return shlex.join(["vllm", *self.arguments])


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only: a loopback address or "localhost"."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _has_api_key(passthrough: tuple[str, ...]) -> bool:
    """Whether `vllm serve` will ask for a key: --api-key among the pass-through flags, or VLLM_API_KEY."""
    given = any(argument == "--api-key" or argument.startswith("--api-key=") for argument in passthrough)
    return given or bool(os.environ.get("VLLM_API_KEY"))


def split_target(positional: str | None, flag: str | None, extra: list[str]) -> tuple[str, tuple[str, ...]]:
    """TARGET and the pass-through arguments. Click hands the first argument it did not know to
    TARGET even when that is a pass-through flag (`mars serve --target X --port 8000`), so the
    arguments are taken back in order: TARGET is the first of them when it is not a flag."""
    rest = ([positional] if positional is not None else []) + list(extra)
    given = rest.pop(0) if rest and not rest[0].startswith("-") else None
    require(given is None or flag is None or given == flag,
            f"two targets: TARGET {given} and --target {flag}; give one (a pass-through flag's value goes after "
            "its flag, and TARGET before them all)")
    from ..models import DEFAULT_TARGET

    return given or flag or DEFAULT_TARGET, tuple(rest)


def plan(request: ServeRequest) -> ServePlan:
    """Resolve the target, the drafter and MARS (in that order: each needs the one before), and
    build `vllm serve`'s arguments: ours, then the pass-through ones in the order given."""
    request.validate()
    target_dir = engine.target_directory(request.target)
    try:
        speculative = engine.speculative_config(request.draft, target_dir, request.num_draft)
    except UserError as exc:
        if request.draft in ("none", "ngram") or request.draft.partition(":")[0] == "head":
            raise
        raise UserError(f"--draft {request.draft}: {exc}") from None  # a draft model spec
    mapping = settings.mapping_for(request.verification)
    resolved = None
    if mapping is not None:
        try:
            resolved = settings.resolve(mapping, target_dir, speculative=speculative is not None)
        except UserError as exc:
            raise UserError(_in_flag_terms(str(exc))) from None
    arguments = ["serve", target_dir, "--host", request.host, "--port", str(request.port), "--dtype", request.dtype]
    if request.max_model_len is not None:
        arguments += ["--max-model-len", str(request.max_model_len)]
    if request.seed is not None:
        arguments += ["--seed", str(request.seed)]
    if speculative is not None:
        arguments += ["--speculative-config", json.dumps(speculative)]
    if resolved is not None:
        arguments += ["--additional-config", json.dumps({settings.KEY: resolved})]
    drafter_dirs = [speculative["model"]] if speculative is not None and speculative["method"] == "draft_model" else []
    kv_cache = memory.plan_kv_cache(target_dir, drafter_dirs, request.dtype, request.max_model_len, 1,
                                    request.passthrough)
    if kv_cache is not None:  # on a CPU: sized from the memory at hand, not 92% of all RAM
        arguments += ["--kv-cache-memory-bytes", str(kv_cache[0])]
    return ServePlan(request.target, target_dir, speculative, resolved, (*arguments, *request.passthrough),
                     request.host, request.port, _has_api_key(request.passthrough),
                     kv_cache[1] if kv_cache is not None else None)


def _in_flag_terms(message: str) -> str:
    for mapping_words, flag_words in IN_FLAG_TERMS:
        message = message.replace(mapping_words, flag_words)
    return message


def vllm_program(arguments: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """The command line of `vllm ARGUMENTS` in this Python's environment, and the environment to run
    it in: with the environment's Intel OpenMP preloaded (vLLM's CPU kernels want it first) unless
    LD_PRELOAD is already set. VLLM_CPU_KVCACHE_SPACE and the rest stay as the user set them.

    The `vllm` script next to this Python when vLLM is installed as the distribution "vllm";
    vllm-cpu's script stops before it parses anything (vLLM's CLI asks for the version of a
    distribution named "vllm"), so there this module runs vLLM's CLI itself (`_vllm_cli`)."""
    bin_dir = Path(sys.executable).parent
    script = bin_dir / "vllm"
    if _installed_as_vllm() and script.is_file() and os.access(script, os.X_OK):
        argv = [str(script), *arguments]
    else:
        argv = [sys.executable, "-m", "mars_cli.serving.serve", *arguments]
    environment = dict(os.environ)
    openmp = bin_dir.parent / "lib" / "libiomp5.so"
    if openmp.is_file() and not environment.get("LD_PRELOAD"):
        environment["LD_PRELOAD"] = str(openmp)
    return argv, environment


def _installed_as_vllm() -> bool:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("vllm")
    except PackageNotFoundError:
        return False
    return True


def exec_vllm(serve_plan: ServePlan) -> NoReturn:
    """Become `vllm serve`: same process id, so signals and process managers reach vLLM."""
    argv, environment = vllm_program(serve_plan.arguments)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, environment)
    raise AssertionError("unreachable")  # execve returns only by raising


def _vllm_cli() -> None:
    """`python -m mars_cli.serving.serve ARGS` is `vllm ARGS` where vLLM is installed as vllm-cpu:
    vLLM's own CLI, with the version of "vllm" looked up as vllm-cpu's (0.32.0+cpu)."""
    import importlib.metadata as metadata

    lookup = metadata.version

    def version(name: str) -> str:
        try:
            return lookup(name)
        except metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return lookup("vllm-cpu") + "+cpu"  # as vllm.platforms names it, to detect the CPU build

    metadata.version = version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    sys.exit(vllm_main())


if __name__ == "__main__":
    _vllm_cli()
