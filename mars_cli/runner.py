"""From user-facing options to a ready decoding session (shared by every subcommand).

`DecodingOptions` mirrors the shared CLI flags and validates them; `Session` loads the target
(and a draft model if asked), builds the drafter and verifier once, and decodes prompts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import torch

from .head.drafter import HeadDrafter, find_head, load_head
from .decoding.drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter, check_same_vocabulary
from .decoding.loop import DecodeSettings, decode, make_generator
from .decoding.sampling import SamplingParams
from .decoding.stats import DecodeStats
from .decoding.verifiers import DEFAULT_THRESHOLD, MARGIN_MEASURES, Verifier
from . import profiles
from .errors import UserError, require
from .models import DEFAULT_TARGET, LoadedModel, load_model

MAX_NUM_DRAFT = 64
DEFAULT_NUM_DRAFT = 4
DEFAULT_HEAD_CONFIDENCE = 0.1  # from the held-out cost model in docs/head.md


@dataclass
class DecodingOptions:
    target: str = DEFAULT_TARGET
    draft: str = "none"
    verify: str = "strict"
    threshold: float | None = None
    margin: str = "logit-ratio"
    profile: str | None = None
    num_draft: int = DEFAULT_NUM_DRAFT
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    device_map: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    raw: bool = False
    stop: tuple[str, ...] = ()
    head_confidence: float = DEFAULT_HEAD_CONFIDENCE  # draft head: stop drafting below this
    ngram_max: int = 3
    ngram_min: int = 1
    force: bool = False  # use a --profile calibrated for another model

    def validate(self) -> None:
        """Every bad value gets one clear sentence (the CLI turns it into exit code 2)."""
        require(self.verify in ("strict", "mars"), f"--verify {self.verify}: expected strict or mars")
        require(self.margin in MARGIN_MEASURES, f"--margin {self.margin}: expected logit-ratio or prob-ratio")
        require(self.max_new_tokens >= 1, f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")
        require(math.isfinite(self.temperature) and self.temperature >= 0,
                f"--temperature must be a finite number >= 0, got {self.temperature}")
        require(math.isfinite(self.top_p) and 0 < self.top_p <= 1, f"--top-p must be in (0, 1], got {self.top_p}")
        require(self.top_k >= 0, f"--top-k must be >= 0 (0 disables it), got {self.top_k}")
        require(1 <= self.num_draft <= MAX_NUM_DRAFT,
                f"--num-draft must be between 1 and {MAX_NUM_DRAFT}, got {self.num_draft}")
        require(math.isfinite(self.head_confidence) and 0 <= self.head_confidence < 1,
                f"--head-confidence must be in [0, 1), got {self.head_confidence}")
        if self.threshold is not None:
            require(math.isfinite(self.threshold) and 0 < self.threshold <= 1,
                    f"--threshold must be in (0, 1] for both margin measures, got {self.threshold}")

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


@dataclass
class ResolvedThreshold:
    value: float
    source: str  # "flag", "default" or the profile file's path


def resolve_threshold(options: DecodingOptions, target: LoadedModel) -> ResolvedThreshold:
    """--threshold wins; then --profile; then a profile matching the target's fingerprint
    (user directory, then shipped); then the paper's 0.9. Profiles hold raw-scale thresholds,
    converted to the sampling temperature in use."""
    if options.threshold is not None:
        return ResolvedThreshold(options.threshold, "flag")
    if options.profile is not None:
        profile = profiles.load(options.profile)
        profiles.check_matches(profile, target.fingerprint, target.spec, options.force)
    elif options.verify == "mars":
        profile = profiles.find_for(target.fingerprint)
    else:
        profile = None
    if profile is None:
        return ResolvedThreshold(DEFAULT_THRESHOLD, "default")
    if options.margin not in profile.data["thresholds"]:
        raise UserError(f"profile {profile.path} has no threshold for --margin {options.margin}")
    theta = profiles.threshold_at_temperature(profile.threshold(options.margin), options.margin, options.temperature)
    return ResolvedThreshold(theta, str(profile.path))


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: DecodeStats = field(default_factory=DecodeStats)


def encode_messages(tokenizer: object, messages: list[dict], raw: bool = False) -> list[int]:
    """A conversation through the chat template (plain concatenation without one, or if `raw`)."""
    if raw or not getattr(tokenizer, "chat_template", None):
        return list(tokenizer.encode("\n".join(m["content"] for m in messages)))
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # BatchEncoding in transformers 5
        ids = ids["input_ids"]
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)


class Session:
    """One loaded target (and drafter) serving many prompts with fixed options."""

    def __init__(self, options: DecodingOptions, target: LoadedModel | None = None,
                 draft_model: LoadedModel | None = None) -> None:
        """`target` and `draft_model` let several sessions share models already loaded."""
        options.validate()
        self.options = options
        self.target = target or load_model(
            options.target, options.device, options.dtype, options.device_map, options.trust_remote_code,
            options.allow_pickle,
        )
        window = self.target.context_window
        require(window is None or options.max_new_tokens < window,
                f"--max-new-tokens {options.max_new_tokens} is beyond the model's context window ({window})")
        self.threshold = resolve_threshold(options, self.target)
        self.verifier = Verifier(
            rule=options.verify,  # type: ignore[arg-type]
            threshold=self.threshold.value,
            measure=options.margin,  # type: ignore[arg-type]
            sampling=options.sampling,
        )
        self.draft_model: LoadedModel | None = draft_model
        self.drafter = self._build_drafter()

    def _build_drafter(self) -> Drafter:
        spec = self.options.draft
        if spec == "none":
            return NoDrafter(self.target.device)
        if spec == "ngram":
            return NgramDrafter(self.target.device, self.options.ngram_max, self.options.ngram_min)
        seed = None if self.options.seed is None else self.options.seed + 1
        if spec == "auto":  # the target's draft head when it has one, plain decoding otherwise
            found = find_head(self.target)
            if found is None:
                return NoDrafter(self.target.device)
            spec = f"head:{found}"
        if spec == "head" or spec.startswith("head:"):
            head = load_head(spec, self.target)
            return HeadDrafter(head, self.target, self.options.sampling, make_generator(self.target.output_device, seed),
                               self.options.head_confidence)
        draft = self.draft_model if self.draft_model is not None and self.draft_model.spec == spec else load_model(
            spec, self.options.device, self.options.dtype, None, self.options.trust_remote_code,
            self.options.allow_pickle)
        check_same_vocabulary(self.target, draft)
        self.draft_model = draft
        return ModelDrafter(draft, self.options.sampling, make_generator(draft.device, seed))

    # ------------------------------------------------------------------ prompts
    def encode(self, prompt: str) -> list[int]:
        """Apply the chat template when the model has one (unless --raw)."""
        require(prompt.strip() != "", "the prompt is empty")
        return self.encode_messages([{"role": "user", "content": prompt}])

    def encode_messages(self, messages: list[dict]) -> list[int]:
        return self._fits(encode_messages(self.target.tokenizer, messages, self.options.raw))

    def _fits(self, ids: list[int]) -> list[int]:
        window = self.target.context_window
        if window is not None:
            require(len(ids) < window,
                    f"the prompt has {len(ids)} tokens but the model's context window is {window}")
        return ids

    # ------------------------------------------------------------------ decoding
    def settings(self) -> DecodeSettings:
        return DecodeSettings(self.options.max_new_tokens, self.options.num_draft, self.options.stop)

    def stream(self, prompt_ids: list[int], stats: DecodeStats,
               observe: Callable[[torch.Tensor], None] | None = None,
               seed: int | None = None, settings: DecodeSettings | None = None) -> Iterator[list[int]]:
        """Decode one prompt. `seed` overrides --seed for this call (calibration varies it);
        `settings` overrides the loop settings (profiling sweeps the draft length)."""
        seed = self.options.seed if seed is None else seed
        generator = make_generator(self.target.output_device, seed)
        if seed is not None and self.drafter.generator is not None:
            self.drafter.generator.manual_seed(seed + 1)
        return decode(self.target, self.drafter, self.verifier, prompt_ids, settings or self.settings(),
                      generator, stats, observe)

    def run(self, prompt: str | list[int], observe: Callable[[torch.Tensor], None] | None = None,
            seed: int | None = None, settings: DecodeSettings | None = None) -> Result:
        prompt_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        stats = DecodeStats()
        tokens: list[int] = []
        for chunk in self.stream(prompt_ids, stats, observe, seed, settings):
            tokens.extend(chunk)
        return Result(self.decode_text(tokens), tokens, stats)

    def decode_text(self, tokens: list[int]) -> str:
        return self.target.tokenizer.decode(tokens, skip_special_tokens=True)

    def config(self) -> dict[str, object]:
        """Every resolved setting, for --json and reports."""
        resolved = asdict(self.options)
        resolved["stop"] = list(self.options.stop)
        resolved.update(
            threshold=self.threshold.value,
            threshold_source=self.threshold.source,
            target_source=self.target.source,
            drafter=self.drafter.name,
            draft_head=getattr(getattr(self.drafter, "head", None), "source", None),
            device=str(self.target.device),
            dtype=str(self.target.dtype).replace("torch.", ""),
            torch_version=torch.__version__,
            threads=torch.get_num_threads(),
        )
        return resolved
