"""The `mars` command line: parse, call, render. No decoding logic lives here."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.console import Console

from . import __version__, calibration
from .errors import StaticCacheFull, UserError, require
from .notes import note, warn
from .paths import DISK_FULL, claim_output, release_outputs
from .flags import DECODING, DECODING_FLAGS, MODEL, SAMPLING, decoding_flags
from .options import DecodingOptions
from .render import calibration_table, eval_table, stats_table
from .session import Session

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

# what `generate` reads of stdin at most: 2**20 tokens at a generous 64 bytes each (Session.encode then
# holds a prompt to its model's own window, in bytes, before tokenizing it)
MAX_PROMPT_BYTES = 64 << 20
BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell shows for a reader that closed the pipe early
_invocation: list[str] = []  # the arguments of this run, recorded in profiles for reproduction
_tracebacks = False  # --debug: errors raise instead of becoming one line


# ----------------------------------------------------------------------------- commands
@app.callback(invoke_without_command=True)
def root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    """Speculative decoding with margin-aware verification: generate, calibrate, profile, eval."""
    global _tracebacks
    _tracebacks = debug  # read by main() when a command fails
    if version:
        out.print(f"mars-cli {__version__}")
        raise typer.Exit()


@app.command()
@decoding_flags(*DECODING_FLAGS, "stop", "raw", defaults={"draft": "auto"})
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; '-' or nothing reads stdin.")] = None,
    *,
    options: DecodingOptions,  # the shared flags, from @decoding_flags
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (text, config, stats) instead of streaming.")] = False,
    show_stats: Annotated[bool, typer.Option("--stats", help="Print decoding statistics as a table after the text.")] = False,
) -> None:
    """Generate a continuation of PROMPT, streaming the text as it is decoded."""
    from .startup import Startup
    from .tuning.clock import TALLY

    startup = Startup()
    options.validate()  # --seed too (check_seed)
    text = read_prompt(prompt)
    session = Session(options)
    startup.built(TALLY.seconds)
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
    phases = startup.phases(TALLY.seconds, stats.phase_s["prefill"], stats.wall_s)
    if as_json:
        payload = {
            "text": session.decode_text(tokens),
            "new_tokens": len(tokens),
            "token_ids": tokens,
            "config": session.config(),
            "stats": {**stats.summary(), "startup_s": phases},
            "tuning": session.tuning_report(),
        }
        sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")
        session.check_drift(stats)
        return
    out.print()
    session.check_drift(stats)
    if show_stats:
        err.print(stats_table({**stats.summary(), "startup_s": phases}, session.config()))


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
        data = sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1)  # never the whole of an endless or huge stream
        require(len(data) <= MAX_PROMPT_BYTES, f"the prompt on stdin is over {MAX_PROMPT_BYTES >> 20} MiB; no "
                                               "model's context window holds that much")
        try:
            prompt = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"stdin is not valid UTF-8 (byte {exc.start})") from None
    else:
        prompt = _valid_utf8(prompt, "the prompt argument")
    if not prompt.strip():
        raise UserError("the prompt is empty")
    return prompt


def _valid_utf8(text: str, what: str) -> str:
    """Arguments arrive decoded with surrogateescape: a lone surrogate marks a byte that is not
    UTF-8, which the tokenizer would fail on with a traceback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = len(text[:exc.start].encode("utf-8", "surrogateescape"))
        raise UserError(f"{what} is not valid UTF-8 (byte {byte})") from None
    return text


@app.command()
@decoding_flags("model", "draft", "num_draft", "margin", without=("device_map",),
                defaults={"draft": "auto", "num_draft": "4"})
def calibrate(
    *,
    options: DecodingOptions,  # the model flags, --draft, --num-draft and --margin (quality=), from @decoding_flags
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="JSONL prompt set (a 'prompt' field per line); default: the built-in set.")] = None,
    temperature: Annotated[float, typer.Option(
        "--temperature", help="Temperature of the sampled mode (recorded in the profile).")] = 1.0,
    modes: Annotated[str, typer.Option(
        "--modes", help="Decoding modes to fit: greedy (T = 0), sampled (--temperature) or both.")] = "greedy,sampled",
    samples: Annotated[int, typer.Option("--samples", help="Generated positions used to fit the thresholds.")] = 1500,
    held_out_samples: Annotated[Optional[int], typer.Option(
        "--held-out-samples", help="Positions from held-out prompts for the check (default: a third of --samples).")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        "--max-new-tokens", "-n", help="Length of each continuation (default 64; 48 for quality=).")] = None,
    objective: Annotated[str, typer.Option(
        "--objective", help="rate=R (share of low-margin positions), loss=L (nats/token bound) or quality=DROP "
                            "(most permissive theta whose task metrics stay within a relative DROP of strict).")] = calibration.DEFAULT_OBJECTIVE,
    suite: Annotated[str, typer.Option(
        "--suite", help="quality=: comma-separated suites with task metrics (math, summarize, translate, code, "
                        "or a .jsonl file).")] = calibration.DEFAULT_SUITES,
    limit: Annotated[str, typer.Option(
        "--limit", help="quality=: samples per suite, taken from its end (eval --limit takes the front), or auto: "
                        "more until the decision is clear (at most 32).")] = str(calibration.DEFAULT_LIMIT),
    thetas: Annotated[Optional[str], typer.Option(
        "--thetas", help="quality=: thresholds to sweep, e.g. 0.8,0.9,0.95 (default: five per --margin).")] = None,
    allow_code_execution: Annotated[bool, typer.Option(
        "--allow-code-execution", help="quality=: run generated code to score code suites (sandboxed).")] = False,
    weak_sandbox: Annotated[bool, typer.Option(
        "--weak-sandbox", help="Accept weaker isolation for generated code where namespaces are unavailable.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Random seed: the same seed gives the same profile.")] = 0,
    out_path: Annotated[Optional[Path], typer.Option(
        "--out", help="Where to write the YAML profile (default: the user profile directory).")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="Draw the sweep (tau and quality against theta, chosen point marked) to this PNG.")] = None,
    replot: Annotated[Optional[Path], typer.Option(
        "--replot", help="Draw the sweep stored in this profile to --plot, without calibrating.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON instead of a table.")] = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue an interrupted calibration with the same options and --out.")] = False,
) -> None:
    """Fit per-model MARS thresholds per decoding mode (a bound, or measured quality) into a YAML profile."""
    if replot is not None:
        require(plot is not None, "--replot PROFILE draws to --plot FILE: give both")
        _check_writable_file(plot)
        calibration.replot(replot, plot)
        out.print(f"plot written to {plot}")
        return
    destination = out_path or calibration.default_destination(options.model.target)
    request = calibration.CalibrationRequest(destination, prompts=prompts, temperature=temperature, samples=samples,
                                             held_out_samples=held_out_samples, max_new_tokens=max_new_tokens,
                                             objective=objective, seed=seed, resume=resume, modes=modes, suite=suite,
                                             limit=limit, thetas=thetas, allow_code_execution=allow_code_execution,
                                             weak_sandbox=weak_sandbox)
    request.validate()
    options.drafting.validate()
    if plot is not None:
        require(request.quality, "--plot draws a quality= sweep; rate= and loss= fits have none")
        _check_writable_file(plot)
    job = calibration.Calibration(options, request)  # reads the prompts (quality=: the suites)
    _check_writable(request.destination)
    claim_output(request.destination, "calibrate")  # its partial file too: one writer at a time
    _remove_leftovers(request.destination, request.partial)
    job.load()  # the interrupted run's positions (--resume) and the target
    with _progress() as progress:
        def start_pass(stage: str, total: int) -> Callable[[int], None]:
            task = progress.add_task(stage, total=total)
            return lambda n: progress.advance(task, n)

        data, written = job.run(_reproduce_command("calibrate"), start_pass, note)
    if plot is not None:
        calibration.plot_sweeps(data, plot)
    if as_json:
        sys.stdout.write(json.dumps({"profile": str(written), **data}) + "\n")
        return
    for table in calibration_table(data):
        out.print(table)
    out.print(f"profile written to {written}" + (f"; plot written to {plot}" if plot is not None else ""))


@app.command("train-head")
@decoding_flags("model", "num_draft", without=("device_map", "compile", "packed_weights", "engine"),
                defaults={"num_draft": "4"})
def train_head(
    *,
    options: DecodingOptions,  # the model flags and --num-draft, from @decoding_flags
    out_path: Annotated[Optional[Path], typer.Option(
        "--out", help="Where to write the head (eagle3: a directory; eagle1: a .safetensors file; default: "
                      "the user head directory, where --draft head finds it).")] = None,
    architecture: Annotated[str, typer.Option(
        "--arch", help="eagle3 (fused low/mid/high features, public EAGLE-3 format) or eagle1 (the "
                       "original single-file head).")] = "eagle3",
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="JSONL prompt set (a 'prompt' field, or a 'messages' conversation ending in a user turn, "
                          "per line); default: the built-in set of 638.")] = None,
    max_new_tokens: Annotated[int, typer.Option(
        "--max-new-tokens", "-n", help="Longest answer of the target to each prompt.")] = 256,
    sampled_share: Annotated[float, typer.Option(
        "--sampled-share", help="Share of prompts answered by sampling instead of greedily (0..1).")] = 0.0,
    sample_temperature: Annotated[float, typer.Option(
        "--sample-temperature", help="Temperature of the sampled answers (top-p 0.95).")] = 0.8,
    data_only: Annotated[bool, typer.Option(
        "--data-only", help="Generate the answers and extract the features (cached, resumable), then stop.")] = False,
    generate_batch: Annotated[int, typer.Option(
        "--generate-batch", help="Prompts answered together while generating the data.")] = 16,
    vocab: Annotated[int, typer.Option(
        "--vocab", help="Draft vocabulary: the most frequent tokens of the data (0: the full vocabulary).")] = 8192,
    epochs: Annotated[int, typer.Option("--epochs", help="Passes over the training answers.")] = 8,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per training step.")] = 8,
    learning_rate: Annotated[float, typer.Option("--lr", help="Peak learning rate (warm-up, then cosine).")] = 1e-3,
    depth: Annotated[int, typer.Option(
        "--depth", help="Drafting steps unrolled in training (the head learns from its own predictions).")] = 3,
    loss: Annotated[str, typer.Option(
        "--loss", help="soft: match the target's whole distribution over the draft vocabulary (distillation); "
                       "hard: only its top token.")] = "soft",
    init: Annotated[Optional[str], typer.Option(
        "--init", help="Fine-tune this EAGLE-3 head (`head`: the target's own; or a directory) instead of a "
                       "fresh one; its draft vocabulary is kept.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed: initial weights and data order.")] = 0,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue from the checkpoint next to --out (data already generated is always reused).")] = False,
    compile_step: Annotated[str, typer.Option(
        "--compile", help="Compile the training step with torch.compile: on, off, or auto (on for runs of 200 "
                          "steps or more where torch can compile: 1-3 minutes, then faster steps).")] = "auto",
) -> None:
    """Train an EAGLE-style draft head for a target on its own greedy answers (self-distillation)."""
    from .training import HeadRecipe, HeadTraining, checkpoint_path
    from .head.train import TrainSettings
    from .paths import user_head_dir
    from .render import head_table

    options.drafting.validate()
    require(not options.drafting.adaptive, "train-head: --num-draft needs a number (the draft length that "
                                           "held-out acceptance is measured at)")
    settings = TrainSettings(architecture=architecture, epochs=epochs, batch_size=batch_size,
                             learning_rate=learning_rate, depth=depth, loss=loss, vocab=vocab,
                             num_draft=options.drafting.max_draft, seed=seed, compile=compile_step)
    recipe = HeadRecipe(prompts, max_new_tokens, generate_batch, settings, sampled_share, sample_temperature, init)
    recipe.validate()
    name = Path(options.model.target).name.removesuffix(".gguf")
    if architecture == "eagle3":
        destination = out_path or user_head_dir() / name
        require(not destination.exists() or destination.is_dir(),
                f"--out {destination}: an EAGLE-3 head is a directory, and this is a file")
        _check_writable_file(destination / "config.json")
    else:
        destination = out_path or user_head_dir() / f"{name}.safetensors"
        require(destination.suffix == ".safetensors", f"--out {destination}: an eagle1 head is a .safetensors file")
        _check_writable_file(destination)
    claim_output(destination, "train-head")  # and its checkpoint: one writer at a time
    _remove_leftovers(destination, checkpoint_path(destination), destination / "model.safetensors",
                      destination / "config.json")
    training = HeadTraining(options.model, recipe, checkpoint_path(destination) if resume and not data_only else None)
    if data_only:
        with _progress() as progress:
            stages: dict[str, int] = {}

            def report_data(stage: str, done: int, total: int) -> None:
                stages.setdefault(stage, progress.add_task(stage, total=total))
                progress.update(stages[stage], completed=done)

            sequences, _ = training.data(report_data)
        tokens = sum(len(s.output_ids) for s in sequences)
        out.print(f"data ready: {len(sequences)} answers, {tokens} answer tokens (cached; train with the same flags)")
        return
    with _progress() as progress:
        tasks: dict[str, int] = {}

        def report(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=total)
            progress.update(tasks[stage], completed=done)

        def on_step(step: int, total: int, loss: float) -> None:
            report("train", step, total)
            progress.update(tasks["train"], description=f"train (loss {loss:.3f})")

        trained = training.run(destination, _reproduce_command("train-head"), resume, report, on_step)
    out.print(head_table(trained.head, trained.held, trained.answers, trained.answer_tokens))
    out.print(f"draft head written to {destination}")


@app.command("tune")
@decoding_flags("model", without=("device_map", "compile", "packed_weights", "dtype"))
def tune_command(
    *,
    options: DecodingOptions,  # --target, --device and the trust flags, from @decoding_flags
    as_json: Annotated[bool, typer.Option("--json", help="Print the choices as one JSON object.")] = False,
) -> None:
    """Measure every choice `auto` makes for the target on this machine (dtype, packed linears, cost
    curve, int8 head; with --engine llama.cpp its thread count and cost curve), afresh and
    unbounded, and cache them: run it once after installing, and again after the machine changes.
    Later runs then measure nothing."""
    import torch
    from rich.progress import Progress

    from .render import tune_table
    from .tuning import machine, tune

    options.validate()
    if options.model.engine == "llama.cpp":  # its own choices: threads, then the width curve
        target = options.model.load()
    else:
        target = options.model.load(dtype=torch.float32)  # the reference every dtype is measured from
    with Progress(console=err, transient=True, disable=as_json) as progress:
        task = progress.add_task("tuning", total=len(tune.steps(target, options.model.allow_pickle)))
        rows = tune.run(target, options.model.allow_pickle,
                        lambda done, name: progress.update(task, completed=done, description=f"measuring the {name}"))
    facts = machine.machine_facts()
    if as_json:
        sys.stdout.write(json.dumps({"machine": facts, "target": target.spec, "choices": rows}) + "\n")
        return
    out.print(tune_table(rows, facts))


@app.command("profile")
@decoding_flags(*DECODING_FLAGS, "raw", defaults={"draft": "ngram"})
def profile_command(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt (default: a built-in summarisation prompt).")] = None,
    *,
    sweep_num_draft: Annotated[Optional[str], typer.Option(
        "--sweep-num-draft", help="Also run each draft length, e.g. 1:8 or 2,4,8, and show the best.")] = None,
    bucket: Annotated[int, typer.Option("--bucket", help="Output positions per tokens/s bucket.")] = 32,
    overhead_repeats: Annotated[int, typer.Option(
        "--overhead-repeats", help="Runs with and without per-phase timing to measure its own cost (0: skip).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write the charts to this PNG file.")] = None,
    trace: Annotated[Optional[Path], typer.Option(
        "--trace", help="Write a torch.profiler trace (open in chrome://tracing or Perfetto).")] = None,
    widths: Annotated[bool, typer.Option(
        "--widths", help="Measure the target's forward cost by verification width (1-16) afresh, cache it for "
                         "--num-draft auto, and show the draft length it picks for this run's acceptance.")] = False,
    dtypes: Annotated[bool, typer.Option(
        "--dtypes", help="Measure a plain decoding step of the target in each dtype (float32, bfloat16; float16 "
                         "too on a GPU) and check each one's output against float32's, afresh; cache the choice "
                         "for --dtype auto and show the table.")] = False,
    options: DecodingOptions,  # the shared flags, from @decoding_flags
) -> None:
    """Show where decoding time goes: time split, acceptance, margins, draft-length sweep."""
    from .profiling import DEFAULT_PROMPT, parse_range, plot_report, run_profile
    from .render import profile_tables

    options.validate()  # --seed too (check_seed)
    prompt = None if prompt is None else _valid_utf8(prompt, "the prompt argument")
    sweep = parse_range(sweep_num_draft) if sweep_num_draft else None
    require(bucket >= 1, f"--bucket must be at least 1, got {bucket}")
    require(overhead_repeats >= 0, f"--overhead-repeats must be >= 0, got {overhead_repeats}")
    for path in (plot, trace):
        if path is not None:
            _check_writable_file(path)
    require(not (dtypes and options.model.device_map), "--dtypes measures a target on one device: drop --device-map")
    # --dtypes measures for speculative decoding unless --draft none
    session = Session(options, options.model.load(measure_dtypes=True, speculative=options.drafting.drafts)
                      if dtypes else None)
    report = run_profile(session, prompt or DEFAULT_PROMPT, sweep, bucket, overhead_repeats, trace, widths, dtypes)
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
@decoding_flags(*DECODING_FLAGS, defaults={"draft": "ngram"}, without=("verify", "engine"))
def eval_command(
    suite: Annotated[str, typer.Option(
        "--suite", "-s", help="Comma-separated: chat, code, math, summarize, translate, all (the five), "
                              "humaneval, a .jsonl file, or hf:NAME[:CONFIG][:SPLIT].")] = "chat",
    methods: Annotated[str, typer.Option(
        "--methods", help="Comma-separated methods: vanilla, strict, mars (vanilla is always added); "
                          "RULE:DRAFTER overrides --draft for one method, e.g. strict:ngram,mars:head; +SHAPE fixes "
                          "its draft tree, e.g. strict:head+4x16 (1: a chain).")] = "vanilla,strict,mars",
    sweep: Annotated[Optional[str], typer.Option(
        "--sweep", help="Also run MARS at each threshold START:STOP:STEP, e.g. 0.80:0.98:0.02.")] = None,
    sweep_tree: Annotated[Optional[str], typer.Option(
        "--sweep-tree", help="Also run every method at each draft-tree shape TOPKxTOKENS (1: a chain), "
                             "e.g. 1,4x8,4x16,8x32.")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Use only the first N samples of each suite.")] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed runs per sample and method (median wall).")] = 1,
    *,
    options: DecodingOptions,  # the shared flags (the rule comes from --methods), from @decoding_flags
    min_speedup: Annotated[Optional[float], typer.Option(
        "--min-speedup", rich_help_panel="Gates", help="Fail (exit 1) if a method is slower than this ratio to vanilla.")] = None,
    max_quality_drop: Annotated[Optional[float], typer.Option(
        "--max-quality-drop", rich_help_panel="Gates",
        help="Fail (exit 1) if a method's task metric, or its ROUGE-L agreement with vanilla, drops by more.")] = None,
    baseline: Annotated[Optional[Path], typer.Option(
        "--baseline", rich_help_panel="Gates",
        help="A stored run (its directory or results.json) to compare every figure with, paired by sample, "
             "with 95% intervals. Refused when the target, head, dtype, token budget, temperature, engine or "
             "suites differ.")] = None,
    baseline_ignore: Annotated[Optional[str], typer.Option(
        "--baseline-ignore", rich_help_panel="Gates",
        help="Comma-separated identity keys that may differ from the baseline: target, head, dtype, "
             "max_new_tokens, temperature, engine, suites.")] = None,
    max_regression: Annotated[Optional[str], typer.Option(
        "--max-regression", rich_help_panel="Gates",
        help="With --baseline: fail (exit 1) where a figure's interval lies wholly below the baseline less its "
             "tolerance, e.g. tau=0.05,modelled=0.05,task=0.02. tau, modelled and speedup are relative (0.05: "
             "5%); task, agreement and logprob absolute.")] = None,
    save_baseline: Annotated[Optional[Path], typer.Option(
        "--save-baseline", rich_help_panel="Gates",
        help="Also write this run's results.json (per-sample figures included) into DIR, as a baseline.")] = None,
    junit: Annotated[Optional[Path], typer.Option(
        "--junit", rich_help_panel="Gates",
        help="Write the gates as JUnit XML: one test case per suite x method x gate.")] = None,
    allow_code_execution: Annotated[bool, typer.Option(
        "--allow-code-execution", help="Run generated code to score code suites (sandboxed subprocess).")] = False,
    weak_sandbox: Annotated[bool, typer.Option(
        "--weak-sandbox", help="Accept weaker isolation for generated code where namespaces are unavailable "
                               "(process group, limits, nobody when root).")] = False,
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out", help="Directory for results.json, samples.jsonl, report.md and plots.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted run in --out.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as one JSON object.")] = False,
    engine: Annotated[str, typer.Option(
        "--engine", help="ours (the mars loop on transformers, one sample at a time), llama.cpp (the mars loop on "
                         "llama.cpp: a GGUF target; needs `make setup-llamacpp`) or vllm (vLLM with the MARS plugin, "
                         "batched, chains only; needs `make setup-vllm`).")] = "ours",
    batch_size: Annotated[int, typer.Option(
        "--batch-size", help="--engine vllm: samples decoded together (ours decodes one at a time).")] = 1,
) -> None:
    """Compare decoding methods for speed and quality on benchmark suites; gate CI jobs on it."""
    from .evaluation import report as reporting
    from .evaluation import runner as ev
    from .evaluation.methods import parse_methods, parse_sweep, parse_tree_sweep
    from .evaluation.results import Gates, build_results, describe_sessions, determinism, run_signature
    from .evaluation.suites import load_suites

    options.validate()  # --seed too (check_seed)
    require(repeats >= 1, f"--repeats must be at least 1, got {repeats}")
    require(limit is None or limit >= 1, f"--limit must be at least 1, got {limit}")
    from .evaluation import baseline as baselines
    from .evaluation import ci

    gates = Gates(min_speedup, max_quality_drop, baselines.parse_regressions(max_regression))
    gates.validate()
    require(baseline is not None or not (gates.max_regression or baseline_ignore),
            "--max-regression and --baseline-ignore compare with a stored run: add --baseline PATH")
    ignored = baselines.parse_ignore(baseline_ignore)
    stored = baselines.load(baseline) if baseline is not None else None  # refused before any model loads
    if save_baseline is not None:
        ci.check_destination(save_baseline)
    method_list = parse_methods(methods, parse_sweep(sweep) if sweep else [],
                                parse_tree_sweep(sweep_tree) if sweep_tree else None)
    specs, suites = load_suites(suite, limit, allow_code_execution)
    strict_sandbox = True
    if allow_code_execution and any(s.needs_execution for s in suites):
        from .evaluation.execution import sandbox_mode

        strict_sandbox = sandbox_mode(weak_sandbox)  # refuses (exit 2) before any model loads
    require(engine in ("ours", "llama.cpp", "vllm"), f"--engine {engine}: expected ours, llama.cpp or vllm")
    if engine == "llama.cpp":  # the mars loop, its target on llama.cpp
        options = options.replace(engine="llama.cpp")
    on_vllm = engine == "vllm"
    require(on_vllm or batch_size == 1, "--batch-size needs --engine vllm (ours decodes one sample at a time)")
    if on_vllm:
        from .serving import evaluation as vllm_eval
        from .serving.engine import require_vllm

        require(repeats == 1, "--engine vllm times each batch once: drop --repeats")
        vllm_eval.check_engine_options(options, batch_size)
        vllm_eval.check_methods(method_list)
        require_vllm()
    signature = run_signature(specs, limit, method_list, repeats, options,
                              {"name": "vllm", "batch_size": batch_size} if on_vllm else None)
    log_path = ev.prepare_out_dir(out_dir, resume, signature)

    # one target for every method: `--dtype auto` chooses for speculative decoding if any method drafts
    drafting = any(options.replace(**method.changes).drafting.drafts for method in method_list)
    sessions = None if on_vllm else ev.build_sessions(options, method_list, options.model.load(speculative=drafting))
    log = ev.SampleLog(log_path)
    total = sum(len(s.samples) for s in suites) * len(method_list)
    interrupted = False
    engines = None
    try:
        if on_vllm:  # vLLM compiles its forwards unless told not to: --compile off runs it eagerly
            engines = vllm_eval.start_engines(method_list, options, enforce_eager=options.model.compile == "off")
            described = vllm_eval.describe(engines, method_list, options, batch_size)
        else:
            described = describe_sessions(method_list, sessions)
        identity = ev.run_identity(described[0], suites, sessions, options)
        if stored is not None:  # before any sample runs
            baselines.check_comparable(identity, stored, ignored, baseline)
        with _progress() as progress:
            task = progress.add_task("evaluating", total=total)
            advance = lambda name: progress.update(task, advance=1, description=f"evaluating ({name})")  # noqa: E731
            if on_vllm:
                vllm_eval.evaluate(suites, method_list, options, engines, log, batch_size, allow_code_execution,
                                   advance, strict_sandbox)
            else:
                ev.evaluate(suites, method_list, sessions, log, repeats, allow_code_execution, advance, strict_sandbox)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if engines is not None:
            engines.shutdown()
    if stored is not None:
        baselines.check_samples(log.records, stored["samples"], baseline)
        curve = {**stored["cost_curve"], "source": f"the baseline's ({baseline})"} if stored.get("cost_curve") else None
    else:
        curve = None if interrupted else ev.cost_curve(sessions or {}, log.records)
    results, failures = build_results(
        _reproduce_command("eval"), suites, method_list, described, repeats, not interrupted, log.records, gates,
        identity=identity, cost_curve=curve, determinism=determinism(options, method_list, str(described[0].get("dtype"))),
        baseline=(stored, str(baseline)) if stored is not None else None)
    if out_dir is not None:
        reporting.write_all(results, out_dir, with_plots=not interrupted)
    if save_baseline is not None and not interrupted:
        ci.save_baseline(results, save_baseline)
    if junit is not None:
        ci.write_junit(results, junit)
    ci.report_to_github(results, reporting.markdown(results), stream=sys.stderr if as_json else sys.stdout)
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
    if gates.active:
        err.print("gates passed")


SERVE_HELP = (
    "Serve a target with vLLM's OpenAI-compatible server (`vllm serve`), speculative decoding verified by MARS "
    "with the target's calibrated threshold.\n\n"
    "Prints each choice on stderr (target directory, speculative config, MARS's thresholds), then becomes "
    "`vllm serve`. It listens on 127.0.0.1 (this machine only) unless --host says otherwise, and warns when a "
    "server others can reach has no --api-key. Flags mars does not know (--api-key, --tensor-parallel-size, "
    "--enforce-eager, ...) and everything after `--` go to `vllm serve` unchanged, after mars's own. Needs vLLM "
    "in this environment (`make setup-vllm`); --dry-run does not.")


@app.command("serve", help=SERVE_HELP, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@decoding_flags("verification", defaults={"verify": "mars"})
def serve(
    ctx: typer.Context,
    target_arg: Annotated[Optional[str], typer.Argument(
        metavar="TARGET", show_default=False,
        help="Target model, as --target: embedded name, repo id, model directory or .gguf file (default "
             "smollm2-135m). Before any pass-through flag.")] = None,
    *,
    target: Annotated[Optional[str], typer.Option(
        "--target", rich_help_panel=MODEL, show_default=False, help="The target, as TARGET.")] = None,
    draft: Annotated[str, typer.Option(
        "--draft", rich_help_panel=DECODING,
        help="Drafter: 'head' (the target's EAGLE-3 head), 'head:DIR', 'ngram' (prompt lookup), 'none', or a "
             "draft model spec sharing the target's vocabulary.")] = "head",
    num_draft: Annotated[int, typer.Option(
        "--num-draft", rich_help_panel=DECODING, help="Tokens drafted per round (1-16).")] = 3,
    options: DecodingOptions,  # --verify (default mars), --threshold, --margin, --calibration, --force
    dtype: Annotated[str, typer.Option(
        "--dtype", rich_help_panel=MODEL,
        help="auto (vLLM's choice: float32 weights run in bfloat16 on CPU and recent GPUs), float32 (the exact "
             "mode), bfloat16 or float16.")] = "auto",
    max_model_len: Annotated[Optional[int], typer.Option(
        "--max-model-len", rich_help_panel=MODEL, show_default=False,
        help="Longest sequence (prompt and output) served; default: the model's context length.")] = None,
    seed: Annotated[Optional[int], typer.Option(
        "--seed", rich_help_panel=SAMPLING, show_default=False,
        help="vLLM's random seed (default: vLLM's, 0).")] = None,
    host: Annotated[str, typer.Option(
        "--host", help="Address to listen on: 127.0.0.1 (this machine only) unless given; 0.0.0.0 for every "
                       "interface (then pass --api-key too).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8000,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Resolve everything, print the `vllm serve` command on stdout and exit.")] = False,
) -> None:
    """Serve a target with vLLM's OpenAI-compatible server, drafts verified by MARS (SERVE_HELP has the rest)."""
    from .serving import engine
    from .serving.serve import ServeRequest, exec_vllm, plan, split_target

    chosen, passthrough = split_target(target_arg, target, ctx.args)
    request = ServeRequest(chosen, draft, num_draft, options.verification, dtype, max_model_len, seed, passthrough,
                           host, port)
    request.validate()
    if not dry_run:
        engine.require_vllm()  # before the target converts, not after
    serve_plan = plan(request)
    for line in serve_plan.choices():
        note(line)
    if (exposure := serve_plan.exposure()) is not None:
        warn(exposure)
    if dry_run:
        sys.stdout.write(serve_plan.shell() + "\n")
        return
    note(f"running: {serve_plan.shell()}")
    exec_vllm(serve_plan)


def _check_writable_file(path: Path) -> None:
    """The file's directory must exist (or be creatable: its last level only, see
    paths.create_directory) and be writable."""
    import os

    from .paths import check_can_create, create_directory

    require(not path.is_dir(), f"{path} is a directory; name a file")
    parent = path.parent if str(path.parent) else Path(".")
    create_directory(parent)
    require(os.access(parent, os.W_OK), f"cannot write to {parent}")
    # an existing file may refuse writes its directory allows (immutable, read-only bind)
    require(not path.exists() or os.access(path, os.W_OK), f"cannot write {path}: the file is not writable")
    check_can_create(parent, path)


def _remove_leftovers(*paths: Path) -> None:
    """Temporaries a killed run left beside its outputs (the output is claimed: no one else writes
    them), removed with one note."""
    from .paths import remove_leftovers

    removed = sum(remove_leftovers(path) for path in paths)
    if removed:
        note(f"removed {removed} temporary file{'s' if removed > 1 else ''} an interrupted run left beside "
             f"{paths[0]}")


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
    global _invocation, _tracebacks
    args = sys.argv[1:] if argv is None else argv
    _invocation = list(args)
    _tracebacks = False
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
    except BrokenPipeError:
        return _closed_pipe()
    except SystemExit as exc:  # click turns EPIPE into exit(1), which the contract keeps for failed gates
        if isinstance(exc.__context__, OSError) and exc.__context__.errno == errno.EPIPE:
            return _closed_pipe()
        raise
    except UserError as exc:
        if _tracebacks:
            raise
        print(f"mars: error: {exc}{_advice(exc)}", file=sys.stderr)
        return 2
    except FloatingPointError as exc:
        if _tracebacks:
            raise
        print(f"mars: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in DISK_FULL or _tracebacks:
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        print(f"mars: error: {exc.strerror}{where}: free some space (or point --out, TMPDIR or MARS_CACHE "
              "elsewhere); what was written before is kept", file=sys.stderr)
        return 2
    finally:
        release_outputs()  # a command's outputs are its own until it ends (the process may go on: tests)


def _advice(error: UserError) -> str:
    """What the user can do about an error the decoding core raised in its own terms."""
    if isinstance(error, StaticCacheFull):
        return "; decode with --compile off"
    return ""


def _closed_pipe() -> int:
    """The reader of stdout went away (`mars generate ... | head -c 5`): stop quietly with 141,
    the status a shell reports for a process ended by SIGPIPE (128 + 13). Later flushes go to
    /dev/null so that the interpreter's exit prints nothing either."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
