"""`mars train-head`: train an EAGLE-style draft head on the target's own answers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import require
from ..flags import decoding_flags
from ..options import DecodingOptions
from ..paths import claim_output
from .common import check_writable_file, out, progress_bar, remove_leftovers, reproduce_command

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


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
    from ..training import HeadRecipe, HeadTraining, checkpoint_path
    from ..head.train import TrainSettings
    from ..paths import user_head_dir
    from ..render import head_table

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
        check_writable_file(destination / "config.json")
    else:
        destination = out_path or user_head_dir() / f"{name}.safetensors"
        require(destination.suffix == ".safetensors", f"--out {destination}: an eagle1 head is a .safetensors file")
        check_writable_file(destination)
    claim_output(destination, "train-head")  # and its checkpoint: one writer at a time
    remove_leftovers(destination, checkpoint_path(destination), destination / "model.safetensors",
                      destination / "config.json")
    training = HeadTraining(options.model, recipe, checkpoint_path(destination) if resume and not data_only else None)
    if data_only:
        with progress_bar() as progress:
            stages: dict[str, int] = {}

            def report_data(stage: str, done: int, total: int) -> None:
                stages.setdefault(stage, progress.add_task(stage, total=total))
                progress.update(stages[stage], completed=done)

            sequences, _ = training.data(report_data)
        tokens = sum(len(s.output_ids) for s in sequences)
        out.print(f"data ready: {len(sequences)} answers, {tokens} answer tokens (cached; train with the same flags)")
        return
    with progress_bar() as progress:
        tasks: dict[str, int] = {}

        def report(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=total)
            progress.update(tasks[stage], completed=done)

        def on_step(step: int, total: int, loss: float) -> None:
            report("train", step, total)
            progress.update(tasks["train"], description=f"train (loss {loss:.3f})")

        trained = training.run(destination, reproduce_command("train-head"), resume, report, on_step)
    out.print(head_table(trained.head, trained.held, trained.answers, trained.answer_tokens))
    out.print(f"draft head written to {destination}")
