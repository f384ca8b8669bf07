"""The `mars` command line: parse, call, render. No decoding logic lives here."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from . import __version__
from .calibrate import DEFAULT_OBJECTIVE
from .errors import UserError, require
from .models import DEFAULT_TARGET, EMBEDDED
from .render import calibration_table, eval_table, stats_table
from .runner import DEFAULT_HEAD_CONFIDENCE, DEFAULT_NUM_DRAFT, DecodingOptions, Session

app = typer.Typer(
    name="mars",
    help="Margin-aware speculative decoding (MARS) for causal language models, offline-first.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# Tables stay readable in logs and pipes too (rich assumes 80 columns when not on a terminal).
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False)

EMBEDDED_NAMES = ", ".join(EMBEDDED)
_invocation: list[str] = []  # the arguments of this run, recorded in profiles for reproduction
DECODING = "Decoding"
SAMPLING = "Sampling"
MODEL = "Model and device"

# ----------------------------------------------------------------------------- shared flags
Target = Annotated[str, typer.Option(
    "--target", "-t", rich_help_panel=MODEL,
    help=f"Target model: embedded name ({EMBEDDED_NAMES}), Hugging Face repo id, model directory or .gguf file.")]
Draft = Annotated[str, typer.Option(
    "--draft", "-d", rich_help_panel=DECODING,
    help="Drafter: 'none' (plain decoding), 'ngram' (prompt lookup), 'head' (the trained draft head for the "
         "target; head:FILE for another) or a model spec sharing the target's vocabulary.")]
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
HeadConfidence = Annotated[float, typer.Option(
    "--head-confidence", rich_help_panel=DECODING,
    help="Draft head only: end a round's drafts once the head's own probability that all of them are "
         "accepted falls below this (0 always drafts --num-draft).")]
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
AllowPickle = Annotated[bool, typer.Option(
    "--allow-pickle", rich_help_panel=MODEL,
    help="Allow pickle checkpoints (.bin/.pt), which can run code when loaded. Safetensors otherwise.")]


_OPTION_FIELDS = {f.name for f in dataclasses.fields(DecodingOptions)}


def _options(parameters: dict) -> DecodingOptions:
    """DecodingOptions from a command's parameters (its `locals()`): the shared flags have the
    same names as the option fields, everything else is the command's own."""
    values = {name: value for name, value in parameters.items() if name in _OPTION_FIELDS}
    if "stop" in values:
        values["stop"] = tuple(values["stop"] or ())
    return DecodingOptions(**values)


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
    force: Annotated[bool, typer.Option(
        "--force", rich_help_panel=DECODING, help="Use a --profile calibrated for another model.")] = False,
    num_draft: NumDraft = DEFAULT_NUM_DRAFT,
    head_confidence: HeadConfidence = DEFAULT_HEAD_CONFIDENCE,
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
    allow_pickle: AllowPickle = False,
) -> None:
    """Generate a continuation of PROMPT, streaming the text as it is decoded."""
    options = _options(locals())
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


@app.command()
def calibrate(
    target: Target = DEFAULT_TARGET,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="JSONL prompt set (a 'prompt' field per line); default: the built-in set.")] = None,
    temperature: Annotated[float, typer.Option(
        "--temperature", help="Sampling temperature for the continuations (recorded in the profile).")] = 1.0,
    samples: Annotated[int, typer.Option("--samples", help="Generated positions used to fit the thresholds.")] = 1500,
    held_out_samples: Annotated[Optional[int], typer.Option(
        "--held-out-samples", help="Positions from held-out prompts for the check (default: a third of --samples).")] = None,
    max_new_tokens: Annotated[int, typer.Option(
        "--max-new-tokens", "-n", help="Length of each sampled continuation.")] = 64,
    objective: Annotated[str, typer.Option(
        "--objective", help="rate=R (share of low-margin positions) or loss=L (nats/token bound).")] = DEFAULT_OBJECTIVE,
    seed: Annotated[int, typer.Option("--seed", help="Random seed: the same seed gives the same profile.")] = 0,
    out_path: Annotated[Optional[Path], typer.Option(
        "--out", help="Where to write the YAML profile (default: the user profile directory).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON instead of a table.")] = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue an interrupted calibration with the same options and --out.")] = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
    trust_remote_code: TrustRemoteCode = False,
    allow_pickle: AllowPickle = False,
) -> None:
    """Estimate per-model MARS thresholds from sampled logits and write a YAML profile."""
    options = _options(locals())
    from . import calibrate as cal
    from . import profiles
    from .paths import user_profile_dir

    goal = cal.parse_objective(objective)
    require(samples >= 50, f"--samples must be at least 50, got {samples}")
    held = samples // 3 if held_out_samples is None else held_out_samples
    require(held >= 10, f"--held-out-samples must be at least 10, got {held}")
    prompt_texts, prompt_name, prompt_hash = cal.load_prompts(prompts)
    destination = out_path or user_profile_dir() / f"{Path(target).name.removesuffix('.gguf')}.yaml"
    _check_writable(destination)
    partial = destination.with_name(destination.name + ".partial.json")
    signature = {"target": target, "prompts": prompt_hash, "temperature": temperature, "samples": samples,
                 "held": held, "max_new_tokens": max_new_tokens, "seed": seed}
    fit_sample, held_sample = cal.load_partial(partial, signature) if resume else (cal.MarginSample(), None)
    session = Session(options)
    session.target.fingerprint  # computed now: a model that cannot be fingerprinted fails before sampling
    fit_ids, held_ids = cal.split_prompts(len(prompt_texts))
    with _progress() as progress:
        task = progress.add_task("sampling (fit)", total=samples)
        fit_sample = cal.collect(session, prompt_texts, fit_ids, samples, seed,
                                 lambda n: progress.advance(task, n), fit_sample,
                                 lambda s: cal.save_partial(partial, signature, s, None))
        task = progress.add_task("sampling (held out)", total=held)
        held_sample = cal.collect(session, prompt_texts, held_ids, held, seed + 100_000,
                                  lambda n: progress.advance(task, n), held_sample,
                                  lambda s: cal.save_partial(partial, signature, fit_sample, s))
    command = _reproduce_command("calibrate")
    data = cal.build_profile(session, fit_sample, held_sample, goal, temperature,
                             {"name": prompt_name, "sha256": prompt_hash, "prompts": len(prompt_texts)},
                             command, seed)
    written = profiles.save(data, destination)
    partial.unlink(missing_ok=True)
    if as_json:
        sys.stdout.write(json.dumps({"profile": str(written), **data}) + "\n")
        return
    out.print(calibration_table(data))
    out.print(f"profile written to {written}")


@app.command("train-head")
def train_head(
    target: Target = DEFAULT_TARGET,
    out_path: Annotated[Optional[Path], typer.Option(
        "--out", help="Where to write the head (.safetensors; default: the user head directory, "
                      "where --draft head finds it).")] = None,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="JSONL prompt set (a 'prompt' field per line); default: the built-in set of 638.")] = None,
    max_new_tokens: Annotated[int, typer.Option(
        "--max-new-tokens", "-n", help="Length of the target's greedy answer to each prompt.")] = 256,
    generate_batch: Annotated[int, typer.Option(
        "--generate-batch", help="Prompts answered together while generating the data.")] = 16,
    vocab: Annotated[int, typer.Option(
        "--vocab", help="Draft vocabulary: the most frequent tokens of the data (0: the full vocabulary).")] = 8192,
    epochs: Annotated[int, typer.Option("--epochs", help="Passes over the training answers.")] = 8,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per training step.")] = 8,
    learning_rate: Annotated[float, typer.Option("--lr", help="Peak learning rate (warm-up, then cosine).")] = 1e-3,
    depth: Annotated[int, typer.Option(
        "--depth", help="Drafting steps unrolled in training (the head learns from its own predictions).")] = 3,
    num_draft: NumDraft = DEFAULT_NUM_DRAFT,
    seed: Annotated[int, typer.Option("--seed", help="Random seed: initial weights and data order.")] = 0,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue from the checkpoint next to --out (data already generated is always reused).")] = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
    trust_remote_code: TrustRemoteCode = False,
    allow_pickle: AllowPickle = False,
) -> None:
    """Train an EAGLE-style draft head for a target on its own greedy answers (self-distillation)."""
    from .calibrate import load_prompts
    from .head import data as head_data
    from .head.train import HELD_OUT_EVERY, TrainSettings, train
    from .models import load_model
    from .paths import user_head_dir
    from .render import head_table

    require(max_new_tokens >= 8, f"--max-new-tokens must be at least 8, got {max_new_tokens}")
    require(generate_batch >= 1, f"--generate-batch must be at least 1, got {generate_batch}")
    require(vocab >= 0, f"--vocab must be 0 (full) or a token count, got {vocab}")
    require(learning_rate > 0, f"--lr must be positive, got {learning_rate}")
    require(min(epochs, batch_size, depth) >= 1, "--epochs, --batch-size and --depth must be at least 1")
    destination = out_path or user_head_dir() / f"{Path(target).name.removesuffix('.gguf')}.safetensors"
    require(destination.suffix == ".safetensors", f"--out {destination}: a head is a .safetensors file")
    _check_writable_file(destination)
    prompt_texts, prompt_name, prompt_hash = load_prompts(prompts, head_data.HEAD_PROMPTS, HELD_OUT_EVERY)
    settings = TrainSettings(epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, depth=depth,
                             vocab=vocab, num_draft=num_draft, seed=seed)
    loaded = load_model(target, device, dtype, None, trust_remote_code, allow_pickle)
    folder = head_data.data_dir(loaded, prompt_hash, max_new_tokens)
    with _progress() as progress:
        tasks: dict[str, int] = {}

        def report(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=total)
            progress.update(tasks[stage], completed=done)

        sequences = head_data.generate(loaded, prompt_texts, folder / "generations.jsonl", max_new_tokens,
                                       generate_batch, report)
        features = head_data.extract_features(loaded, sequences, folder / "features.safetensors",
                                              max(1, generate_batch // 2), report)
        step_task = progress.add_task("train", total=None)

        def on_step(step: int, total: int, loss: float) -> None:
            progress.update(step_task, completed=step, total=total, description=f"train (loss {loss:.3f})")

        recipe = {"command": _reproduce_command("train-head"), "prompts": prompt_name, "prompts_sha256": prompt_hash,
                  "max_new_tokens": max_new_tokens, "data": "the target's greedy answers (chat template)"}
        checkpoint = destination.with_name(destination.name + ".ckpt")
        head, held, losses = train(loaded, sequences, features, settings, checkpoint, resume, recipe, on_step)
    head.config.recipe["held_out"] = dataclasses.asdict(held) | {"tau": held.tau}
    head.config.recipe["final_loss"] = sum(losses[-10:]) / len(losses[-10:])
    head.save(destination)
    checkpoint.unlink(missing_ok=True)
    out.print(head_table(head, held, len(sequences), sum(len(s.output_ids) for s in sequences)))
    out.print(f"draft head written to {destination}")


@app.command("profile")
def profile_command(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt (default: a built-in summarisation prompt).")] = None,
    target: Target = DEFAULT_TARGET,
    draft: Draft = "ngram",
    verify: Verify = "strict",
    threshold: Threshold = None,
    margin: Margin = "logit-ratio",
    profile: Profile = None,
    num_draft: NumDraft = DEFAULT_NUM_DRAFT,
    head_confidence: HeadConfidence = DEFAULT_HEAD_CONFIDENCE,
    max_new_tokens: MaxNew = 128,
    temperature: Temperature = 0.0,
    top_p: TopP = 1.0,
    top_k: TopK = 0,
    seed: Seed = None,
    sweep_num_draft: Annotated[Optional[str], typer.Option(
        "--sweep-num-draft", help="Also run each draft length, e.g. 1:8 or 2,4,8, and show the best.")] = None,
    bucket: Annotated[int, typer.Option("--bucket", help="Output positions per tokens/s bucket.")] = 32,
    overhead_repeats: Annotated[int, typer.Option(
        "--overhead-repeats", help="Runs with and without per-phase timing to measure its own cost (0: skip).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write the charts to this PNG file.")] = None,
    trace: Annotated[Optional[Path], typer.Option(
        "--trace", help="Write a torch.profiler trace (open in chrome://tracing or Perfetto).")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Do not apply the model's chat template.")] = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
    device_map: DeviceMap = None,
    trust_remote_code: TrustRemoteCode = False,
    allow_pickle: AllowPickle = False,
) -> None:
    """Show where decoding time goes: time split, acceptance, margins, draft-length sweep."""
    options = _options(locals())
    from .profiling import DEFAULT_PROMPT, parse_range, plot_report, run_profile
    from .render import profile_tables

    options.validate()
    sweep = parse_range(sweep_num_draft) if sweep_num_draft else None
    require(bucket >= 1, f"--bucket must be at least 1, got {bucket}")
    require(overhead_repeats >= 0, f"--overhead-repeats must be >= 0, got {overhead_repeats}")
    for path in (plot, trace):
        if path is not None:
            _check_writable_file(path)
    session = Session(options)
    report = run_profile(session, prompt or DEFAULT_PROMPT, sweep, bucket, overhead_repeats, trace)
    if plot is not None:
        plot_report(report, plot)
        report["plot"] = str(plot)
    if as_json:
        sys.stdout.write(json.dumps(report) + "\n")
        return
    for table in profile_tables(report):
        out.print(table)
    for key in ("plot", "trace"):
        if key in report:
            out.print(f"{key} written to {report[key]}")


@app.command("eval")
def eval_command(
    suite: Annotated[str, typer.Option(
        "--suite", "-s", help="Comma-separated: chat, code, math, summarize, translate, all (the five), "
                              "humaneval, a .jsonl file, or hf:NAME[:CONFIG][:SPLIT].")] = "chat",
    methods: Annotated[str, typer.Option(
        "--methods", help="Comma-separated methods: vanilla, strict, mars (vanilla is always added); "
                          "RULE:DRAFTER overrides --draft for one method, e.g. strict:ngram,mars:head.")] = "vanilla,strict,mars",
    sweep: Annotated[Optional[str], typer.Option(
        "--sweep", help="Also run MARS at each threshold START:STOP:STEP, e.g. 0.80:0.98:0.02.")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Use only the first N samples of each suite.")] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed runs per sample and method (median wall).")] = 1,
    target: Target = DEFAULT_TARGET,
    draft: Draft = "ngram",
    threshold: Threshold = None,
    margin: Margin = "logit-ratio",
    profile: Profile = None,
    num_draft: NumDraft = DEFAULT_NUM_DRAFT,
    head_confidence: HeadConfidence = DEFAULT_HEAD_CONFIDENCE,
    max_new_tokens: MaxNew = 128,
    temperature: Temperature = 0.0,
    top_p: TopP = 1.0,
    top_k: TopK = 0,
    seed: Seed = None,
    min_speedup: Annotated[Optional[float], typer.Option(
        "--min-speedup", rich_help_panel="Gates", help="Fail (exit 1) if a method is slower than this ratio to vanilla.")] = None,
    max_quality_drop: Annotated[Optional[float], typer.Option(
        "--max-quality-drop", rich_help_panel="Gates",
        help="Fail (exit 1) if a method's task metric, or its ROUGE-L agreement with vanilla, drops by more.")] = None,
    allow_code_execution: Annotated[bool, typer.Option(
        "--allow-code-execution", help="Run generated code to score code suites (sandboxed subprocess).")] = False,
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out", help="Directory for results.json, samples.jsonl, report.md and plots.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted run in --out.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as one JSON object.")] = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
    device_map: DeviceMap = None,
    trust_remote_code: TrustRemoteCode = False,
    allow_pickle: AllowPickle = False,
) -> None:
    """Compare decoding methods for speed and quality on benchmark suites; gate CI jobs on it."""
    options = _options(locals())
    from .evaluation import report as reporting
    from .evaluation import runner as ev
    from .evaluation.suites import BUILTIN, load_suite
    from .models import load_model

    options.validate()
    require(repeats >= 1, f"--repeats must be at least 1, got {repeats}")
    require(limit is None or limit >= 1, f"--limit must be at least 1, got {limit}")
    for name, value in (("--min-speedup", min_speedup), ("--max-quality-drop", max_quality_drop)):
        require(value is None or (value == value and value >= 0), f"{name} must be a number >= 0, got {value}")
    method_list = ev.parse_methods(methods, ev.parse_sweep(sweep) if sweep else [])
    specs = [part.strip() for part in suite.split(",") if part.strip()]
    specs = [name for spec in specs for name in (list(BUILTIN) if spec == "all" else [spec])]
    suites = [load_suite(spec, limit) for spec in specs]
    for loaded in suites:
        if loaded.metric == "pass@1" and not allow_code_execution:
            raise UserError(f"the {loaded.name} suite is scored by running generated code: "
                            "pass --allow-code-execution to allow it (it runs in a sandboxed subprocess)")
    signature = {"suites": specs, "limit": limit, "methods": [m.name for m in method_list], "repeats": repeats,
                 "options": {k: v for k, v in options.__dict__.items() if k not in ("device", "device_map")}}
    log_path = ev.prepare_out_dir(out_dir, resume, signature)

    target_model = load_model(target, device, dtype, device_map, trust_remote_code, allow_pickle)
    sessions = ev.build_sessions(options, method_list, target_model)
    log = ev.SampleLog(log_path)
    total = sum(len(s.samples) for s in suites) * len(method_list)
    interrupted = False
    try:
        with _progress() as progress:
            task = progress.add_task("evaluating", total=total)
            ev.evaluate(suites, method_list, sessions, log, repeats, allow_code_execution,
                        lambda name: progress.update(task, advance=1, description=f"evaluating ({name})"))
    except KeyboardInterrupt:
        interrupted = True
    described = sessions[next((m.name for m in method_list if m.name != "vanilla"), "vanilla")]
    results = {
        "command": _reproduce_command("eval"),
        "suites": [s.name for s in suites],
        "config": described.config(),  # the drafter and flags the non-vanilla methods used
        "methods": {m.name: {**m.changes, **({"threshold": sessions[m.name].threshold.value,
                                              "threshold_source": sessions[m.name].threshold.source}
                                             if sessions[m.name].options.verify == "mars" else {})}
                    for m in method_list},
        "repeats": repeats,
        "complete": not interrupted,
        "table": ev.aggregate(log.records, method_list, [s.name for s in suites]),
    }
    overall = results["table"]["all" if len(suites) > 1 else suites[0].name]
    failures = ev.check_gates(overall, min_speedup, max_quality_drop)
    if min_speedup is not None or max_quality_drop is not None:
        results["gates"] = {"min_speedup": min_speedup, "max_quality_drop": max_quality_drop, "failures": failures}
    if out_dir is not None:
        reporting.write_all(results, out_dir, with_plots=not interrupted)
    if interrupted:
        err.print(f"interrupted: {len(log.records)} finished samples kept" + (f" in {out_dir}; rerun with --resume" if out_dir else ""))
        raise KeyboardInterrupt
    if as_json:
        sys.stdout.write(json.dumps(results, ensure_ascii=False) + "\n")
    else:
        for scope, rows in results["table"].items():
            out.print(eval_table(scope, rows))
        if out_dir is not None:
            out.print(f"results, report and plots written to {out_dir}")
    if failures:
        err.print("gate failed: " + "; ".join(failures))
        raise typer.Exit(1)
    if "gates" in results:
        err.print("gates passed")


def _check_writable_file(path: Path) -> None:
    """The file's directory must exist (or be creatable) and be writable."""
    import os

    require(not path.is_dir(), f"{path} is a directory; name a file")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {parent}: {exc.strerror or exc}") from None
    require(os.access(parent, os.W_OK), f"cannot write to {parent}")


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=err, transient=False)


def _check_writable(path: Path) -> None:
    """Fail before minutes of work, not after."""
    require(not path.is_dir(), f"--out {path} is a directory; name a .yaml file")
    require(path.suffix in (".yaml", ".yml"), f"--out {path}: a profile is a .yaml file")
    _check_writable_file(path)


def _reproduce_command(command: str) -> str:
    """The command line that reproduces this run: the args as given, quoted for a shell, less
    `--resume` (a resumed run reproduces the run it continues)."""
    import shlex

    args = _invocation
    start = args.index(command) if command in args else 0
    return "mars " + " ".join(shlex.quote(a) for a in args[start:] if a != "--resume")


# ----------------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map errors to the contract's exit codes (2 bad input, 130 interrupted)."""
    global _invocation
    args = sys.argv[1:] if argv is None else argv
    _invocation = list(args)
    debug = "--debug" in args
    command = typer.main.get_command(app)
    try:
        # typer turns Ctrl-C into Exit(130) and, in this mode, returns an Exit's code
        result = command.main(args=args, prog_name="mars", standalone_mode=False)
        code = result if isinstance(result, int) else 0
        if code == 130:
            err.print("interrupted")
        return code
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
