"""`mars eval`: compare decoding methods for speed and quality; gate CI jobs on it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import require
from ..flags import DECODING_FLAGS, decoding_flags
from ..options import DecodingOptions
from ..render import eval_table
from .common import err, out, progress_bar, reproduce_command

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


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
    allow_unjudged: Annotated[bool, typer.Option(
        "--allow-unjudged", rich_help_panel="Gates",
        help="With --max-regression: a gate that cannot be judged (a figure only one run has, or one that is not a "
             "number) passes, said so, instead of failing.")] = False,
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
    from ..evaluation import report as reporting
    from ..evaluation import runner as ev
    from ..evaluation.methods import parse_methods, parse_sweep, parse_tree_sweep
    from ..evaluation.results import Gates, build_results, describe_sessions, determinism, run_signature
    from ..evaluation.suites import load_suites, suite_names

    options.validate()  # --seed too (check_seed)
    require(repeats >= 1, f"--repeats must be at least 1, got {repeats}")
    require(limit is None or limit >= 1, f"--limit must be at least 1, got {limit}")
    from ..evaluation import baseline as baselines
    from ..evaluation import ci

    gates = Gates(min_speedup, max_quality_drop, baselines.parse_regressions(max_regression), allow_unjudged)
    gates.validate()
    require(baseline is not None or not (gates.max_regression or baseline_ignore),
            "--max-regression and --baseline-ignore compare with a stored run: add --baseline PATH")
    require(not allow_unjudged or gates.max_regression, "--allow-unjudged passes regression gates: add --max-regression")
    ignored = baselines.parse_ignore(baseline_ignore)
    stored = baselines.load(baseline) if baseline is not None else None  # refused before any model loads
    if save_baseline is not None:
        ci.check_destination(save_baseline)
    method_list = parse_methods(methods, parse_sweep(sweep) if sweep else [],
                                parse_tree_sweep(sweep_tree) if sweep_tree else None)
    specs, suites = load_suites(suite, limit, allow_code_execution)
    # every file the run writes, checked before any model loads (a --junit naming a device, the
    # baseline, a suite or results.json replaced it after the whole run)
    ci.check_outputs(junit, out_dir, baselines.baseline_file(baseline) if baseline is not None else None,
                     save_baseline, inputs=[Path(spec) for spec in specs
                                            if spec not in suite_names() and not spec.startswith("hf:")
                                            and Path(spec).is_file()])
    if stored is not None:  # every method and sample of this run in the baseline, before any model loads
        baselines.check_plan(stored, [(s.name, sample.id) for s in suites for sample in s.samples],
                             [m.name for m in method_list], baseline)
    strict_sandbox = True
    if allow_code_execution and any(s.needs_execution for s in suites):
        from ..evaluation.execution import sandbox_mode

        strict_sandbox = sandbox_mode(weak_sandbox)  # refuses (exit 2) before any model loads
    require(engine in ("ours", "llama.cpp", "vllm"), f"--engine {engine}: expected ours, llama.cpp or vllm")
    if engine == "llama.cpp":  # the mars loop, its target on llama.cpp
        options = options.replace(engine="llama.cpp")
    on_vllm = engine == "vllm"
    require(on_vllm or batch_size == 1, "--batch-size needs --engine vllm (ours decodes one sample at a time)")
    if on_vllm:
        from ..serving import evaluation as vllm_eval
        from ..serving.engine import require_vllm

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
        with progress_bar() as bar:
            task = bar.add_task("evaluating", total=total)
            advance = lambda name: bar.update(task, advance=1, description=f"evaluating ({name})")  # noqa: E731
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
    command = reproduce_command("eval").encode("utf-8", "backslashreplace").decode()  # argv: bytes not UTF-8
    results, failures = build_results(
        command, suites, method_list, described, repeats, not interrupted, log.records, gates,
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
