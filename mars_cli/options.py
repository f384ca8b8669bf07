"""What a decoding session is asked to do, grouped as the CLI's flags are.

Each group is a small frozen dataclass whose field names are the flags' parameter names (`--num-draft`
is `num_draft`), so `mars_cli/flags.py` declares every flag once and maps it onto its field, and
eval's per-method changes (`{"draft": "none", "verify": "strict"}`) apply by the same names
(`DecodingOptions.replace`). `DecodingOptions` holds the four groups and what belongs to no group
(length, stop strings, raw prompts).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from .errors import check_seed, require
from .models.embedded import DEFAULT_TARGET

if TYPE_CHECKING:  # the decoding core imports torch: options stay light for the CLI's warm path
    import torch

    from .decoding.sampling import SamplingParams
    from .models import LoadedModel

MARGIN_MEASURES: tuple[str, ...] = ("logit-ratio", "prob-ratio")  # decoding/rules.py's measures (a test keeps them equal)

# --dtype q4: the linears on 4-bit (or 8-bit) codes, computed in float32; q4a8: against 8-bit activations
QUANTIZED_MODES = ("q4", "q4a8")  # decoding/quantized.py's ACTIVATION_BITS
MAX_NUM_DRAFT = 64
AUTO = "auto"
DEFAULT_NUM_DRAFT = AUTO  # the cost model picks each round's length (decoding/cost.py)
AUTO_MAX_DRAFT = 8  # the longest draft `auto` considers: verification widths up to 9
DEFAULT_HEAD_CONFIDENCE = 0.1  # from the held-out cost model in docs/head.md
MAX_DRAFT_TOPK = 16
MAX_DRAFT_TOKENS = 64  # tree nodes a round: verification widths up to 65


@dataclass(frozen=True)
class ModelOptions:
    """Which target, and where and how to load it: `load_model`'s keyword arguments."""

    target: str = DEFAULT_TARGET
    device: str = "auto"
    dtype: str = "auto"
    device_map: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    compile: str = "auto"  # static cache + compiled forwards: auto, on or off (decoding/target.py)
    packed_weights: str = "auto"  # bfloat16 and float32 linears on prepacked weights: auto, on or off (decoding/packing.py; auto: tuning/packing.py)
    engine: str = "transformers"  # what runs the target's forward: transformers (torch) or llama.cpp (a GGUF file)

    def load(self, spec: str | None = None, *, dtype: torch.dtype | None = None,
             measure_dtypes: bool = False, speculative: bool = False) -> LoadedModel:
        """The target, or with `spec` another model (a draft model) on the same device, dtype and
        trust settings; only the target is spread over devices by --device-map. `dtype`: load in
        this one instead of --dtype's (a draft model in the dtype `auto` chose for its target);
        `measure_dtypes`: `mars profile --dtypes`; `speculative`: it will be decoded with drafting
        (`--dtype auto` chooses for that). The tuning layer settles the dtype (tuning/plan.py)."""
        if self.engine == "llama.cpp":  # the GGUF at its own precision: no dtype to settle
            from .llamacpp.target import load_target

            require(spec is None, "--engine llama.cpp loads its draft model in the session (llamacpp/drafter.py)")
            require(self.dtype == "auto", f"--dtype {self.dtype}: --engine llama.cpp runs the GGUF file at its own "
                                          "precision (leave --dtype auto)")
            require(self.device in ("auto", "cpu"), f"--device {self.device}: --engine llama.cpp runs on the CPU")
            return load_target(self.target)  # type: ignore[return-value]
        from .models import load_model
        from .tuning.plan import settle_dtype

        require(not (measure_dtypes and self.device_map), "--dtypes measures a target on one device: drop --device-map")
        settings: dict = asdict(self)
        for name in ("target", "compile", "packed_weights", "engine"):  # how the scorer runs it, not how it loads
            settings.pop(name)
        if spec is not None:
            settings["device_map"] = None
        flag = settings["dtype"] if dtype is None else dtype
        settings["dtype"] = "auto" if measure_dtypes else flag
        if flag in QUANTIZED_MODES:  # float32 weights, the linears then served from their codes
            require(not self.device_map, f"--dtype {flag} runs on one CPU: drop --device-map")
            settings["dtype"] = "float32"
        loaded = load_model(self.target if spec is None else spec, **settings)
        if flag in QUANTIZED_MODES:
            from .decoding.quantized import quantize_target

            quantize_target(loaded, flag)
            return loaded
        spread = self.device_map is not None and spec is None and flag == "auto"  # unmeasured (models.py)
        if isinstance(flag, str) and (spec is None or flag != "auto") and not spread:
            settle_dtype(loaded, flag, speculative, packed=self.packed_weights != "off", fresh=measure_dtypes)
        return loaded


@dataclass(frozen=True)
class DraftOptions:
    """Who proposes tokens and how many per round."""

    draft: str = "none"
    num_draft: int | str = DEFAULT_NUM_DRAFT  # a fixed length, or "auto"
    head_confidence: float = DEFAULT_HEAD_CONFIDENCE  # draft head: stop drafting below this
    draft_topk: int | str = AUTO  # children per tree node (1: a chain), or "auto" (decoding/cost.py)
    draft_tokens: int | str = AUTO  # nodes per tree, or "auto"
    int8_head: str = "auto"  # the draft head's linears on int8 weights: auto, on or off (head/int8.py; auto: tuning/int8.py)
    draft_lookup: str = "on"  # draft head trees: prompt lookup's continuation grafted on as one more branch

    def __post_init__(self) -> None:
        for name in ("num_draft", "draft_topk", "draft_tokens"):  # "4" from the command line
            value = getattr(self, name)
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                object.__setattr__(self, name, int(value))

    @property
    def drafts(self) -> bool:
        """Whether rounds are drafted at all (`--draft none` decodes plainly)."""
        return self.draft != "none"

    @property
    def adaptive(self) -> bool:
        """`--num-draft auto`: each round's length from the measured cost model."""
        return self.num_draft == AUTO

    @property
    def max_draft(self) -> int:
        """The longest draft a round may propose."""
        return AUTO_MAX_DRAFT if self.adaptive else int(self.num_draft)

    def validate(self) -> None:
        require(self.adaptive or (isinstance(self.num_draft, int) and 1 <= self.num_draft <= MAX_NUM_DRAFT),
                f"--num-draft must be 'auto' or between 1 and {MAX_NUM_DRAFT}, got {self.num_draft}")
        require(math.isfinite(self.head_confidence) and 0 <= self.head_confidence < 1,
                f"--head-confidence must be in [0, 1), got {self.head_confidence}")
        require(self.draft_topk == AUTO or (isinstance(self.draft_topk, int) and 1 <= self.draft_topk <= MAX_DRAFT_TOPK),
                f"--draft-topk must be 'auto' or between 1 and {MAX_DRAFT_TOPK}, got {self.draft_topk}")
        require(self.draft_tokens == AUTO
                or (isinstance(self.draft_tokens, int) and 1 <= self.draft_tokens <= MAX_DRAFT_TOKENS),
                f"--draft-tokens must be 'auto' or between 1 and {MAX_DRAFT_TOKENS}, got {self.draft_tokens}")
        require(self.int8_head in ("auto", "on", "off"), f"--int8-head {self.int8_head}: expected auto, on or off")
        require(self.draft_lookup in ("on", "off"), f"--draft-lookup {self.draft_lookup}: expected on or off")


@dataclass(frozen=True)
class VerifyOptions:
    """The verification rule and where its MARS threshold comes from."""

    verify: str = "strict"
    threshold: float | None = None
    margin: str = "logit-ratio"
    calibration: str | None = None  # a calibration profile (YAML) to take the threshold from
    force: bool = False  # use a --calibration profile made for another model

    def validate(self) -> None:
        require(self.verify in ("strict", "mars"), f"--verify {self.verify}: expected strict or mars")
        require(self.margin in MARGIN_MEASURES, f"--margin {self.margin}: expected logit-ratio or prob-ratio")
        if self.threshold is not None:
            require(math.isfinite(self.threshold) and 0 < self.threshold <= 1,
                    f"--threshold must be in (0, 1] for both margin measures, got {self.threshold}")


@dataclass(frozen=True)
class SamplingOptions:
    """How tokens are chosen from the target's distribution, and the seed that fixes the choice."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def validate(self) -> None:
        require(math.isfinite(self.temperature) and self.temperature >= 0,
                f"--temperature must be a finite number >= 0, got {self.temperature}")
        require(math.isfinite(self.top_p) and 0 < self.top_p <= 1, f"--top-p must be in (0, 1], got {self.top_p}")
        require(self.top_k >= 0, f"--top-k must be >= 0 (0 disables it), got {self.top_k}")
        check_seed(self.seed)

    @property
    def params(self) -> SamplingParams:
        from .decoding.sampling import SamplingParams

        return SamplingParams(self.temperature, self.top_k, self.top_p)


GROUPS: dict[str, type] = {
    "model": ModelOptions,
    "drafting": DraftOptions,
    "verification": VerifyOptions,
    "sampling": SamplingOptions,
}
GROUP_OF: dict[str, str] = {f.name: group for group, kind in GROUPS.items() for f in fields(kind)}


@dataclass(frozen=True)
class DecodingOptions:
    """Everything a `Session` needs; build it from flat flag names with `of`."""

    model: ModelOptions = field(default_factory=ModelOptions)
    drafting: DraftOptions = field(default_factory=DraftOptions)
    verification: VerifyOptions = field(default_factory=VerifyOptions)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    raw: bool = False  # no chat template

    @classmethod
    def of(cls, **values: object) -> DecodingOptions:
        """From flat option names (`target=`, `draft=`, `max_new_tokens=`, ...), each routed to its
        group; unset ones keep their defaults. An unknown name is a TypeError, as for a dataclass."""
        grouped: dict[str, dict[str, object]] = {group: {} for group in GROUPS}
        own: dict[str, object] = {}
        for name, value in values.items():
            if name in GROUP_OF:
                grouped[GROUP_OF[name]][name] = value
            elif name in _OWN_FIELDS:
                own[name] = value
            else:
                raise TypeError(f"DecodingOptions has no option {name!r}")
        if "stop" in own:
            own["stop"] = tuple(own["stop"] or ())  # type: ignore[arg-type]
        return cls(**{group: GROUPS[group](**chosen) for group, chosen in grouped.items()}, **own)  # type: ignore[arg-type]

    def replace(self, **changes: object) -> DecodingOptions:
        """A copy with some options changed, by flat name (eval's methods, benchmark variants)."""
        return DecodingOptions.of(**{**self.flat(), **changes})

    def flat(self) -> dict[str, object]:
        """Every option by its flat name, one level deep: the shape of `--json`'s config."""
        values: dict[str, object] = {}
        for group in GROUPS:
            values.update(asdict(getattr(self, group)))
        values.update({name: getattr(self, name) for name in _OWN_FIELDS})
        return values

    def validate(self) -> None:
        """Every bad value gets one clear sentence (the CLI turns it into exit code 2)."""
        self.verification.validate()
        require(self.model.compile in ("auto", "on", "off"), f"--compile {self.model.compile}: expected auto, on or off")
        require(self.model.packed_weights in ("auto", "on", "off"),
                f"--packed-weights {self.model.packed_weights}: expected auto, on or off")
        require(self.model.engine in ENGINES, f"--engine {self.model.engine}: expected {' or '.join(ENGINES)}")
        require(self.max_new_tokens >= 1, f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")
        self.sampling.validate()
        self.drafting.validate()


ENGINES = ("transformers", "llama.cpp", "auto")  # auto: mars generate's default (engine_choice.py)
_OWN_FIELDS = tuple(f.name for f in fields(DecodingOptions) if f.name not in GROUPS)
