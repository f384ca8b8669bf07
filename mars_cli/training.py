"""`mars train-head`'s recipe: the target's own greedy answers, their features, training, saving.

The steps (data generation, feature extraction, training, the recipe recorded in the head) live
here so that the CLI only parses flags, shows progress and renders the result. The prompts are
read and the target loaded when a `HeadTraining` is made, so bad input fails before any progress bar.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import check_seed, require
from .head import data as head_data
from .head.drafter import load_head
from .head.eagle3 import Eagle3Head
from .head.parts import PairHead
from .head.train import ARCHITECTURES, HELD_OUT_EVERY, LOSSES, HeldOut, TrainSettings, feature_layers, load_checkpoint, train
from .options import ModelOptions
from .prompts import load_prompts

Report = Callable[[str, int, int], None]  # (stage, done, total) while generating and extracting
OnStep = Callable[[int, int, float], None]  # (step, total steps, loss) while training
MAX_LEARNING_RATE = 1.0  # heads train at ~1e-4..1e-2; beyond 1 AdamW's steps swamp any weight
MAX_DEPTH = 16  # training-time test: deeper than any tree the default searches (6 levels), 16x the cost


@dataclass(frozen=True)
class HeadRecipe:
    """How the training data is made and the head trained (the train-head flags)."""

    prompts: Path | None = None  # JSONL prompt set; None: the built-in one
    max_new_tokens: int = 256
    generate_batch: int = 16
    settings: TrainSettings = dataclasses.field(default_factory=TrainSettings)
    sampled_share: float = 0.0  # share of prompts answered by sampling (the rest greedily)
    sample_temperature: float = 0.8
    init: str | None = None  # --init: fine-tune this head ("head" or "head:DIR") instead of a fresh one

    @property
    def answering(self) -> head_data.Answering:
        return head_data.Answering(self.max_new_tokens, self.sampled_share, self.sample_temperature,
                                   seed=self.settings.seed)

    def validate(self) -> None:
        """One sentence per bad value, before anything is loaded."""
        settings = self.settings
        require(self.max_new_tokens >= 8, f"--max-new-tokens must be at least 8, got {self.max_new_tokens}")
        require(0.0 <= self.sampled_share <= 1.0, f"--sampled-share must be in [0, 1], got {self.sampled_share}")
        check_seed(settings.seed)
        require(0.0 < self.sample_temperature <= 2.0,
                f"--sample-temperature must be in (0, 2], got {self.sample_temperature}")
        require(settings.loss in LOSSES, f"--loss {settings.loss}: expected one of {', '.join(LOSSES)}")
        require(settings.compile in ("auto", "on", "off"), f"--compile {settings.compile}: expected auto, on or off")
        require(settings.architecture in ARCHITECTURES,
                f"--arch {settings.architecture}: expected one of {', '.join(ARCHITECTURES)}")
        require(self.generate_batch >= 1, f"--generate-batch must be at least 1, got {self.generate_batch}")
        require(settings.vocab >= 0, f"--vocab must be 0 (full) or a token count, got {settings.vocab}")
        # AdamW steps are about lr in size whatever the gradient: above 1 (or inf, NaN) the
        # weights blow up to NaN within a step, and the head would be saved as such
        require(math.isfinite(settings.learning_rate) and 0 < settings.learning_rate <= MAX_LEARNING_RATE,
                f"--lr must be in (0, {MAX_LEARNING_RATE:g}], got {settings.learning_rate}")
        require(min(settings.epochs, settings.batch_size, settings.depth) >= 1,
                "--epochs, --batch-size and --depth must be at least 1")
        require(settings.depth <= MAX_DEPTH, f"--depth must be at most {MAX_DEPTH}, got {settings.depth}")
        require(self.init is None or settings.architecture == "eagle3",
                "--init fine-tunes an EAGLE-3 head: use it with --arch eagle3")

    def resume_options(self, prompts_sha256: str) -> dict:
        """The options a checkpoint records, by flag: those that shape the data, the head or the
        schedule. --resume refuses a checkpoint made under other values (--num-draft, which only
        sets the held-out measure, may change)."""
        settings = self.settings
        return {"--arch": settings.architecture, "--prompts": prompts_sha256, "--max-new-tokens": self.max_new_tokens,
                "--sampled-share": self.sampled_share, "--sample-temperature": self.sample_temperature,
                "--vocab": settings.vocab, "--epochs": settings.epochs, "--batch-size": settings.batch_size,
                "--lr": settings.learning_rate, "--depth": settings.depth, "--loss": settings.loss,
                "--seed": settings.seed, "--init": self.init or ""}


def checkpoint_path(destination: Path) -> Path:
    """Where training keeps its state while it runs: beside the head it will write."""
    return destination.with_name(destination.name + ".ckpt")


@dataclass
class TrainedHead:
    head: PairHead
    held: HeldOut  # greedy chain acceptance on the held-out answers
    answers: int
    answer_tokens: int


class HeadTraining:
    """One train-head run of a validated recipe: prompts read and target loaded up front, then `run`."""

    def __init__(self, model: ModelOptions, recipe: HeadRecipe, resume_from: Path | None = None) -> None:
        """`resume_from`: the checkpoint --resume continues, checked (present, same options) before
        the target loads."""
        self.recipe = recipe
        self.prompts, self.prompt_name, self.prompt_hash = load_prompts(recipe.prompts, head_data.HEAD_PROMPTS,
                                                                        HELD_OUT_EVERY, conversations=True)
        self.options = recipe.resume_options(self.prompt_hash)
        if resume_from is not None:
            load_checkpoint(resume_from, self.options)
        self.target = model.load()
        self.initial = None  # the head --init fine-tunes, checked against the target now
        if recipe.init is not None:
            spec = recipe.init if recipe.init == "head" or recipe.init.startswith("head:") else f"head:{recipe.init}"
            self.initial = load_head(spec, self.target, model.allow_pickle)

    def data(self, report: Report) -> tuple[list[head_data.Sequence], dict]:
        """Generate (or reuse) the answers and extract (or reuse) the features the head reads."""
        recipe, target = self.recipe, self.target
        folder = head_data.data_dir(target, self.prompt_hash, recipe.answering)
        sequences = head_data.generate(target, self.prompts, folder / "generations.jsonl", recipe.answering,
                                       recipe.generate_batch, report)
        layers = feature_layers(recipe.settings.architecture, target.model)
        name = "features" + "".join(f"_{layer}" for layer in layers)
        features = head_data.extract_features(target, sequences, folder / name, max(1, recipe.generate_batch // 2),
                                              report, layers)
        return sequences, features

    def run(self, destination: Path, command: str, resume: bool, report: Report, on_step: OnStep) -> TrainedHead:
        """Generate (or reuse) the data, train (resuming from the checkpoint beside `destination`
        if asked), and save the head with its recipe and held-out figures."""
        recipe, target = self.recipe, self.target
        sequences, features = self.data(report)
        modes = "greedy" if recipe.sampled_share == 0 else \
            f"greedy, and sampled (T = {recipe.sample_temperature}, top-p 0.95) for {recipe.sampled_share:.0%} of prompts"
        recorded = {"command": command, "prompts": self.prompt_name, "prompts_sha256": self.prompt_hash,
                    "max_new_tokens": recipe.max_new_tokens, "data": f"the target's answers ({modes}; chat template)",
                    "answer_tokens": sum(len(s.output_ids) for s in sequences), "answers": len(sequences)}
        checkpoint = checkpoint_path(destination)
        if recipe.init is not None:
            recorded["fine_tuned_from"] = getattr(self.initial, "source", recipe.init)
        head, held, losses = train(target, sequences, features, recipe.settings, checkpoint, resume, recorded, on_step,
                                   self.options, self.initial)
        record = head.config.mars["recipe"] if isinstance(head, Eagle3Head) else head.config.recipe
        record["held_out"] = dataclasses.asdict(held) | {"tau": held.tau, "decoding_tau": held.decoding_tau}
        record["final_loss"] = sum(losses[-10:]) / len(losses[-10:])
        if isinstance(head, Eagle3Head):
            head.save_pretrained(destination)
        else:
            head.save(destination)
        checkpoint.unlink(missing_ok=True)
        return TrainedHead(head, held, len(sequences), sum(len(s.output_ids) for s in sequences))
