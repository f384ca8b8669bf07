"""The CLI's shared flags, each declared once, and `decoding_flags`, which gives them to commands.

A command takes `options: DecodingOptions` and names the flag groups it accepts; the decorator puts
those groups' typer parameters into the command's signature where `options` stands (typer reads
parameters from the signature) and, when the command runs, builds the options from them. So a
flag's name, help, panel and default live here only, and a command lists just its own flags.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from collections.abc import Callable, Collection, Mapping
from typing import Annotated, Any, Optional, TypeVar

import typer

from .models.embedded import DEFAULT_TARGET, EMBEDDED
from .options import DEFAULT_HEAD_CONFIDENCE, DEFAULT_NUM_DRAFT, DecodingOptions

DECODING = "Decoding"
SAMPLING = "Sampling"
MODEL = "Model and device"
OPTIONS = "options"  # the command parameter the decorator fills


@dataclass(frozen=True)
class Flag:
    """One typer parameter: its name is also the `DecodingOptions` field it sets."""

    name: str
    annotation: Any  # Annotated[type, typer.Option(...)]
    default: Any


def _flag(name: str, kind: Any, default: Any, *names: str, **option: Any) -> Flag:
    return Flag(name, Annotated[kind, typer.Option(*names, **option)], default)


# In help order: within each panel, flags are listed as they stand here.
FLAGS: dict[str, Flag] = {flag.name: flag for flag in (
    _flag("target", str, DEFAULT_TARGET, "--target", "-t", rich_help_panel=MODEL,
          help=f"Target model: embedded name ({', '.join(EMBEDDED)}), Hugging Face repo id, model directory "
               "or .gguf file."),
    _flag("draft", str, "none", "--draft", "-d", rich_help_panel=DECODING,
          help="Drafter: 'auto' (the target's draft head when it has one, else prompt lookup), 'none' (plain "
               "decoding), 'ngram' (prompt lookup), 'head' (the trained draft head for the target; head:DIR for "
               "another) or a model spec sharing the target's vocabulary."),
    _flag("verify", str, "strict", "--verify", rich_help_panel=DECODING,
          help="Verification rule: 'strict' (lossless) or 'mars' (accept a drafted runner-up at low-margin "
               "positions)."),
    _flag("threshold", Optional[float], None, "--threshold", rich_help_panel=DECODING,
          help="MARS threshold theta in (0, 1]; a position is low-margin when its margin exceeds it. "
               "Default: the target's calibrated profile, else 0.9 (the paper's)."),
    _flag("margin", str, "logit-ratio", "--margin", rich_help_panel=DECODING,
          help="Margin measure: 'logit-ratio' (z2/z1, the paper's) or 'prob-ratio' (p2/p1, shift-invariant)."),
    _flag("calibration", Optional[str], None, "--calibration", rich_help_panel=DECODING,
          help="Calibration profile (YAML) to take the threshold from."),
    _flag("force", bool, False, "--force", rich_help_panel=DECODING,
          help="Use a --calibration profile made for another model."),
    _flag("num_draft", str, DEFAULT_NUM_DRAFT, "--num-draft", "-k", rich_help_panel=DECODING,
          help="Tokens drafted per round, or 'auto': each round the length with the most expected tokens "
               "per second, from the target's measured forward cost by width and the drafter's acceptance."),
    _flag("draft_topk", str, "auto", "--draft-topk", rich_help_panel=DECODING,
          help="Children per node of a draft tree (1: a chain), or 'auto': from the target's measured forward "
               "cost by width. A tree is verified in one target pass."),
    _flag("draft_tokens", str, "auto", "--draft-tokens", rich_help_panel=DECODING,
          help="Nodes per draft tree (the verification width less one), or 'auto': as many as the forward "
               "takes at little extra cost."),
    _flag("head_confidence", float, DEFAULT_HEAD_CONFIDENCE, "--head-confidence", rich_help_panel=DECODING,
          help="Draft head only: end a round's drafts once the head's own probability that all of them are "
               "accepted falls below this (0 always drafts --num-draft)."),
    _flag("int8_head", str, "auto", "--int8-head", rich_help_panel=DECODING,
          help="Draft head only: run the head's linear layers on int8 weights (a half or a quarter of the bytes "
               "each drafting step reads): 'on', 'off', or 'auto' (on where a measurement here says it pays: "
               "once per model, head, dtype, device and torch, cached). Drafts may differ slightly; the output "
               "never does."),
    _flag("draft_lookup", str, "on", "--draft-lookup", rich_help_panel=DECODING,
          help="Draft head only: graft prompt lookup's continuation (what followed the latest earlier "
               "occurrence of the text's last 1-3 tokens; up to 8 tokens after a 3-token match) onto each "
               "tree as one more branch, verified in the same pass; a greedy chain drafts that continuation "
               "instead of the head's after a repeated 3 tokens: 'on' or 'off'. Trees on compiled scorers and "
               "sampled chains draft without it."),
    _flag("max_new_tokens", int, 128, "--max-new-tokens", "-n", rich_help_panel=DECODING,
          help="Stop after this many new tokens."),
    _flag("temperature", float, 0.0, "--temperature", rich_help_panel=SAMPLING,
          help="0 decodes greedily; above 0 samples."),
    _flag("top_p", float, 1.0, "--top-p", rich_help_panel=SAMPLING, help="Nucleus sampling mass in (0, 1]."),
    _flag("top_k", int, 0, "--top-k", rich_help_panel=SAMPLING, help="Keep the k most likely tokens (0: all)."),
    _flag("seed", Optional[int], None, "--seed", rich_help_panel=SAMPLING,
          help="Random seed: the same seed gives the same output."),
    _flag("stop", Optional[list[str]], None, "--stop", rich_help_panel=DECODING,
          help="Stop once this string appears (repeatable)."),
    _flag("raw", bool, False, "--raw", help="Do not apply the model's chat template."),
    _flag("device", str, "auto", "--device", rich_help_panel=MODEL,
          help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps."),
    _flag("dtype", str, "auto", "--dtype", rich_help_panel=MODEL,
          help="auto (the dtype whose plain decoding steps run fastest here among those whose output passes a check "
               "against float32's: measured once per model, device and torch, cached), float32 (the exact mode), "
               "bfloat16, float16, q4 (CPU: the linears run on a GGUF's own 4- and 8-bit codes, in float32 "
               "arithmetic; the same numbers as float32 for a quantized GGUF, a lossy 4-bit quantization of "
               "other weights) or q4a8 (the same codes against activations rounded to 8 bits per group of "
               "32, multiplied in integers as llama.cpp does: faster, no longer float32's numbers)."),
    _flag("compile", str, "auto", "--compile", rich_help_panel=MODEL,
          help="Static KV caches with compiled target forwards and drafting steps (CUDA graphs on CUDA): 'on', "
               "'off', or 'auto' (on "
               "for CUDA where torch can compile; off on CPU, where the compile time is not won back)."),
    _flag("packed_weights", str, "auto", "--packed-weights", rich_help_panel=MODEL,
          help="Run the target's bfloat16 or float32 linear layers on weights packed once for the CPU's matrix "
               "kernels: 'on', 'off', or 'auto' (on where a measurement here says it pays: once per model, device, "
               "dtype and torch, cached). The same numbers up to the order of a sum's terms."),
    _flag("engine", str, "transformers", "--engine", rich_help_panel=MODEL,
          help="What runs the target: transformers (torch; any model), llama.cpp (a GGUF file at its own "
               "precision, through llama-cpp-python: `make setup-llamacpp`), or auto (generate's default: llama.cpp "
               "where it is installed, the target is a GGUF and it measured faster here, once, cached; else "
               "transformers). Drafters and verification are ours on both."),
    _flag("device_map", Optional[str], None, "--device-map", rich_help_panel=MODEL,
          help="'auto' spreads a target too large for one device over GPUs (and CPU) with accelerate."),
    _flag("trust_remote_code", bool, False, "--trust-remote-code", rich_help_panel=MODEL,
          help="Allow a model repository's own Python code to run. Off unless you ask."),
    _flag("allow_pickle", bool, False, "--allow-pickle", rich_help_panel=MODEL,
          help="Allow pickle checkpoints (.bin/.pt), which can run code when loaded. Safetensors otherwise."),
)}

# The flags of each option group, named as DecodingOptions' groups (mars_cli/options.py); a name
# a command asks for that is not a group is a single flag.
GROUPS: dict[str, tuple[str, ...]] = {
    "model": ("target", "device", "dtype", "compile", "packed_weights", "engine", "device_map", "trust_remote_code",
              "allow_pickle"),
    "drafting": ("draft", "num_draft", "draft_topk", "draft_tokens", "head_confidence", "int8_head", "draft_lookup"),
    "verification": ("verify", "threshold", "margin", "calibration", "force"),
    "sampling": ("temperature", "top_p", "top_k", "seed"),
}
DECODING_FLAGS = (*GROUPS, "max_new_tokens")  # what every decoding command takes

Command = TypeVar("Command", bound=Callable[..., Any])


def decoding_flags(*wanted: str, defaults: Mapping[str, Any] | None = None,
                   without: Collection[str] = ()) -> Callable[[Command], Command]:
    """Give a command the shared flags of the groups (or single flags) in `wanted`, less `without`;
    `defaults` overrides a flag's default for this command (e.g. `{"draft": "ngram"}`). The
    command receives them as one `options: DecodingOptions`."""
    names = {name for group in wanted for name in GROUPS.get(group, (group,))} - set(without)
    overrides = dict(defaults or {})
    unknown = sorted((names - set(FLAGS)) | (set(overrides) - names))
    if unknown:
        raise TypeError(f"{unknown[0]!r} is not a shared flag this command takes")
    chosen = [flag for flag in FLAGS.values() if flag.name in names]  # in help order

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)  # typer wants real annotations
        own = list(signature.parameters.values())
        at = [p.name for p in own].index(OPTIONS) if OPTIONS in signature.parameters else None
        clashes = names & set(signature.parameters)
        if at is None or clashes:
            raise TypeError(f"{command.__name__}: needs an `{OPTIONS}` parameter and no own parameter named "
                            f"like a shared flag ({', '.join(sorted(clashes))})")
        added = [inspect.Parameter(flag.name, own[at].kind, annotation=flag.annotation,
                                   default=overrides.get(flag.name, flag.default)) for flag in chosen]
        parameters = own[:at] + added + own[at + 1:]

        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            values = {flag.name: kwargs.pop(flag.name) for flag in chosen}
            kwargs[OPTIONS] = DecodingOptions.of(**values)
            return command(*args, **kwargs)

        run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        return run  # type: ignore[return-value]

    return decorate

