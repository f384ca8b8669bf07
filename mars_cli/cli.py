"""The `mars` command line: parse, call, render. No decoding logic lives here."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console

from . import __version__
from .errors import UserError
from .models import DEFAULT_TARGET, EMBEDDED
from .render import stats_table
from .runner import DEFAULT_NUM_DRAFT, DecodingOptions, Session

app = typer.Typer(
    name="mars",
    help="Margin-aware speculative decoding (MARS) for causal language models, offline-first.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)

EMBEDDED_NAMES = ", ".join(EMBEDDED)
DECODING = "Decoding"
SAMPLING = "Sampling"
MODEL = "Model and device"

# ----------------------------------------------------------------------------- shared flags
Target = Annotated[str, typer.Option(
    "--target", "-t", rich_help_panel=MODEL,
    help=f"Target model: embedded name ({EMBEDDED_NAMES}), Hugging Face repo id, model directory or .gguf file.")]
Draft = Annotated[str, typer.Option(
    "--draft", "-d", rich_help_panel=DECODING,
    help="Drafter: 'none' (plain decoding), 'ngram' (prompt lookup) or a model spec sharing the target's vocabulary.")]
Verify = Annotated[str, typer.Option(
    "--verify", rich_help_panel=DECODING,
    help="Verification rule: 'strict' (lossless) or 'mars' (accept a drafted runner-up at low-margin positions).")]
Threshold = Annotated[Optional[float], typer.Option(
    "--threshold", rich_help_panel=DECODING,
    help="MARS threshold theta in (0, 1]; a position is low-margin when its margin exceeds it. "
         "Default: the target's calibrated profile, else 0.9 (the paper's).")]
Margin = Annotated[str, typer.Option(
    "--margin", rich_help_panel=DECODING,
    help="Margin measure: 'logit-ratio' (z2/z1, the paper's) or 'prob-ratio' (p2/p1, shift-invariant).")]
Profile = Annotated[Optional[str], typer.Option(
    "--profile", rich_help_panel=DECODING, help="Calibration profile (YAML) to take the threshold from.")]
NumDraft = Annotated[int, typer.Option(
    "--num-draft", "-k", rich_help_panel=DECODING, help="Tokens drafted per round.")]
MaxNew = Annotated[int, typer.Option(
    "--max-new-tokens", "-n", rich_help_panel=DECODING, help="Stop after this many new tokens.")]
Temperature = Annotated[float, typer.Option(
    "--temperature", rich_help_panel=SAMPLING, help="0 decodes greedily; above 0 samples.")]
TopP = Annotated[float, typer.Option("--top-p", rich_help_panel=SAMPLING, help="Nucleus sampling mass in (0, 1].")]
TopK = Annotated[int, typer.Option("--top-k", rich_help_panel=SAMPLING, help="Keep the k most likely tokens (0: all).")]
Seed = Annotated[Optional[int], typer.Option(
    "--seed", rich_help_panel=SAMPLING, help="Random seed: the same seed gives the same output.")]
Device = Annotated[str, typer.Option(
    "--device", rich_help_panel=MODEL, help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps.")]
Dtype = Annotated[str, typer.Option(
    "--dtype", rich_help_panel=MODEL, help="auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16 or float16.")]
DeviceMap = Annotated[Optional[str], typer.Option(
    "--device-map", rich_help_panel=MODEL,
    help="'auto' spreads a target too large for one device over GPUs (and CPU) with accelerate.")]
TrustRemoteCode = Annotated[bool, typer.Option(
    "--trust-remote-code", rich_help_panel=MODEL,
    help="Allow a model repository's own Python code to run. Off unless you ask.")]


def _options(**values: object) -> DecodingOptions:
    return DecodingOptions(**values)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- commands
@app.callback(invoke_without_command=True)
def root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    """Speculative decoding with margin-aware verification: generate, calibrate, profile, eval."""
    if version:
        out.print(f"mars-cli {__version__}")
        raise typer.Exit()


@app.command()
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; '-' or nothing reads stdin.")] = None,
    target: Target = DEFAULT_TARGET,
    draft: Draft = "none",
    verify: Verify = "strict",
    threshold: Threshold = None,
    margin: Margin = "logit-ratio",
    profile: Profile = None,
    num_draft: NumDraft = DEFAULT_NUM_DRAFT,
    max_new_tokens: MaxNew = 128,
    temperature: Temperature = 0.0,
    top_p: TopP = 1.0,
    top_k: TopK = 0,
    seed: Seed = None,
    stop: Annotated[Optional[list[str]], typer.Option(
        "--stop", rich_help_panel=DECODING, help="Stop once this string appears (repeatable).")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Do not apply the model's chat template.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (text, config, stats) instead of streaming.")] = False,
    show_stats: Annotated[bool, typer.Option("--stats", help="Print decoding statistics as a table after the text.")] = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
    device_map: DeviceMap = None,
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Generate a continuation of PROMPT, streaming the text as it is decoded."""
    options = _options(
        target=target, draft=draft, verify=verify, threshold=threshold, margin=margin, profile=profile,
        num_draft=num_draft, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
        top_k=top_k, seed=seed, device=device, dtype=dtype, device_map=device_map,
        trust_remote_code=trust_remote_code, raw=raw, stop=tuple(stop or ()),
    )
    options.validate()
    text = read_prompt(prompt)
    session = Session(options)
    prompt_ids = session.encode(text)
    from .decoding.stats import DecodeStats

    stats = DecodeStats()
    tokens: list[int] = []
    printed = ""
    try:
        for chunk in session.stream(prompt_ids, stats):
            tokens.extend(chunk)
            if not as_json:
                printed = _stream_text(session.decode_text(tokens), printed)
    except KeyboardInterrupt:
        if not as_json:
            out.print()
        raise
    if as_json:
        payload = {
            "text": session.decode_text(tokens),
            "new_tokens": len(tokens),
            "token_ids": tokens,
            "config": session.config(),
            "stats": stats.summary(),
        }
        sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")
        return
    out.print()
    if show_stats:
        err.print(stats_table(stats.summary(), session.config()))


def _stream_text(full: str, printed: str) -> str:
    """Print what is new; hold back a trailing partial multi-byte character."""
    if full.endswith("\ufffd"):
        return printed
    if full.startswith(printed):
        out.print(full[len(printed):], end="", markup=False)
    return full


def read_prompt(prompt: str | None) -> str:
    if prompt is None or prompt == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UserError("no prompt given: pass PROMPT or pipe it on stdin")
        data = sys.stdin.buffer.read()
        try:
            prompt = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"stdin is not valid UTF-8 (byte {exc.start})") from None
    if not prompt.strip():
        raise UserError("the prompt is empty")
    return prompt


# ----------------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map errors to the contract's exit codes (2 bad input, 130 interrupted)."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name="mars", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except typer.Exit as exc:
        return exc.exit_code
    except typer.TyperException as exc:  # usage errors: click's own message, exit code 2
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        return getattr(exc, "exit_code", 2)
    except (typer.Abort, KeyboardInterrupt):
        err.print("interrupted")
        return 130
    except UserError as exc:
        if debug:
            raise
        print(f"mars: error: {exc}", file=sys.stderr)
        return 2
    except FloatingPointError as exc:
        if debug:
            raise
        print(f"mars: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
