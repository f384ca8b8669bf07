"""From user-facing options to a ready decoding session (shared by every subcommand).

`DecodingOptions` (mars_cli/options.py) holds the grouped, validated options; `Session` loads the
target (and a draft model if asked), builds the drafter and verifier once, and decodes prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from .head.drafter import HeadDrafter, find_head, load_head
from .head.parts import PairHead
from .decoding.drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter, check_same_vocabulary
from .decoding.loop import DecodeSettings, decode
from .decoding.sampling import GREEDY_BELOW, PositionNoise
from .decoding import cost
from .decoding.acceptance import EARLY_HEAD, DraftAcceptance
from .decoding.controller import AdaptiveDraftLength
from .decoding.packing import install as install_packing
from .decoding.stats import DecodeStats
from .decoding.target import TargetScorer, resolve_compile
from .decoding.tree import CHAIN, TreeShape
from .decoding.verifiers import Verifier
from .calibration.profiles import resolve_threshold
from .errors import require
from .models import LoadedModel
from .tuning import clock, curve, drift, int8, machine, plan, threads
from .options import DecodingOptions
from .prompts import encode_messages
from .notes import note


MAX_BYTES_PER_TOKEN = 64  # generous: BPE tokens of common models run to about 16 bytes


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: DecodeStats = field(default_factory=DecodeStats)


class Session:
    """One loaded target (and drafter) serving many prompts with fixed options."""

    _draft_length: AdaptiveDraftLength | None = None
    _curve: cost.CostCurve | None = None  # the widths measured or read so far
    threads_choice: object = None  # --engine llama.cpp: the thread count measured (tuning/threads.py)
    _drift_found = False  # a drift was found and its entries made provisional (tuning/drift.py): once a session
    _plain_timed = (0.0, 0)  # the target seconds and rounds of the prompts decoded so far
    engine_choice: object = None  # --engine auto's verdict (engine_choice.py), where it chose the engine

    @plan.collected  # what its tuning measures is said in one line, when decoding starts (say_tuning)
    def __init__(self, options: DecodingOptions, target: LoadedModel | None = None,
                 draft_model: LoadedModel | None = None) -> None:
        """`target` and `draft_model` let several sessions share models already loaded."""
        options.validate()
        require(options.model.engine != "auto", "--engine auto is resolved by `mars generate`; name an engine "
                                                 "(transformers or llama.cpp)")
        self.options = options
        temperature = options.sampling.temperature
        if 0 < temperature < GREEDY_BELOW:  # logits / T would overflow float32 far below it
            note(f"--temperature {temperature:g} is below {GREEDY_BELOW:g}: decoding greedily, as at 0", once=True)
        self.target = target or options.model.load(speculative=options.drafting.drafts)
        window = self.target.context_window
        require(window is None or options.max_new_tokens < window,
                f"--max-new-tokens {options.max_new_tokens} is beyond the model's context window ({window})")
        self.threshold = resolve_threshold(options, self.target)
        self.verifier = Verifier(
            rule=options.verification.verify,  # type: ignore[arg-type]
            threshold=self.threshold.value,
            measure=options.verification.margin,  # type: ignore[arg-type]
            sampling=options.sampling.params,
        )
        self.draft_model: LoadedModel | None = draft_model
        if options.model.engine == "llama.cpp":
            self._start_on_llamacpp()
            return
        compiled = self._compiled = resolve_compile(options.model.compile, self.target)
        # before the cost curves: they time the forwards as this session runs them
        self.packing = plan.settle_packing(self.target, options.model.packed_weights, compiled)
        # drafter -> the features it reads -> scorer -> cost curve -> tree shape -> drafter: the
        # drafter's source is resolved first, the drafter built last, with its shape
        kind, head = self._drafter_source()
        drafting = options.drafting
        # the static cache's room after the prompt: the token budget and the widest padded round
        widest = max(drafting.max_draft, cost.MAX_TREE_TOKENS if kind != "none" else 0)
        feature_layers = () if head is None else head.feature_layers_for(self.target.model)
        self.scorer = TargetScorer(self.target, feature_layers, static_cache=compiled, compile=compiled,
                                   headroom=options.max_new_tokens + widest + 2, fallback=options.model.compile == "auto")
        self.drafter = self._build_drafter(kind, head, CHAIN if kind == "none" else self._tree_shape(head))
        if self.packing.packed and head is not None:  # the head's products are the target's kind (bfloat16 here)
            install_packing(head)
        # then int8 rows in place of the head's packed (or dense) products, where they pay (tuning/int8.py)
        self.int8_head = (int8.settle(head, self.target, drafting.int8_head, compiled) if head is not None
                          else int8.Int8Choice(False, problem="no draft head"))
        if head is None and drafting.int8_head == "on" and drafting.drafts:  # (plain decoding drafts nothing)
            note(f"--draft {drafting.draft} drafts without a head; --int8-head on is ignored", once=True)
        if kind == "ngram" and isinstance(drafting.draft_topk, int) and drafting.draft_topk > 1:
            note("n-gram lookup has no distribution to branch on: its tree's branches are the continuations of "
                 "earlier matches, as many as it finds", once=True)
        elif kind == "none" and drafting.draft_topk not in (1, "auto"):  # plain decoding: nothing to branch
            note(f"--draft {drafting.draft} proposes nothing; --draft-topk {drafting.draft_topk} is ignored")

    def _start_on_llamacpp(self) -> None:
        """The target's forwards on llama.cpp (llamacpp/): the GGUF at its own precision, so no
        compile, packing or int8 head; drafters that read no hidden states (n-gram lookup, none)."""
        from .llamacpp.scorer import LlamaScorer
        from .tuning.packing import PackingChoice

        spec = self.options.drafting.draft
        require(spec != "head" and not spec.startswith("head:"),
                f"--draft {spec}: --engine llama.cpp drafts with n-gram lookup (ngram, auto), a GGUF draft model or "
                "none; a draft head reads the target's hidden states, which this engine does not hand over (use the "
                "default engine)")
        self._compiled = False
        self.packing = PackingChoice(False, problem="llama.cpp runs the target")
        self.int8_head = int8.Int8Choice(False, problem="no draft head on llama.cpp")
        self.scorer = LlamaScorer(self.target, self.target.engine)  # type: ignore[attr-defined]
        self.threads_choice = threads.choose(self.scorer)  # before the cost curve: it is keyed by the count
        self.scorer.set_threads(self.threads_choice.threads)
        device = self.target.device
        if spec == "none":
            self.drafter = NoDrafter(device)
        elif spec in ("auto", "ngram"):
            self.drafter = NgramDrafter(device, self._tree_shape(None))
        else:  # a draft model, run by llama.cpp too (chains)
            from .llamacpp.drafter import LlamaModelDrafter

            if self.options.drafting.draft_topk not in (1, "auto"):
                note(f"--draft {spec} on llama.cpp drafts chains; --draft-topk {self.options.drafting.draft_topk} "
                     "is ignored", once=True)
            self.drafter = LlamaModelDrafter(spec, self.target, self.options.sampling.params, self.scorer.threads)

    def _tree_shape(self, head: PairHead | None) -> TreeShape:
        """--draft-topk / --draft-tokens, `auto` ones from the target's measured cost curve and the
        drafter's acceptance: a head's own figures when its files record them (acceptance.py)."""
        drafting = self.options.drafting
        topk, tokens = drafting.draft_topk, drafting.draft_tokens
        if topk == 1:
            return CHAIN
        if "auto" in (topk, tokens):
            figures = head.acceptance if head is not None and head.acceptance is not None else EARLY_HEAD
            chosen = self._settled_shape(self._cost_curve(cost.shape_widths(self.scorer.compiled)), figures)
            if topk == "auto":
                topk = chosen.topk
            if tokens == "auto":  # a fixed --draft-topk above 1 asked for a tree even where a chain is cheaper
                tokens = chosen.tokens if chosen.branches or topk == 1 else cost.best_tree_size(self._curve, figures)
        if topk == 1:
            return CHAIN
        room = self.scorer.max_length - 1
        require(tokens < room, f"--draft-tokens {tokens}: a tree that wide does not fit the model's context "
                               f"({room + 1} positions)")
        return TreeShape(int(topk), int(tokens))

    def _settled_shape(self, costs: cost.CostCurve, figures: DraftAcceptance) -> TreeShape:
        """The shape the curve and figures pick; a close call (cost.SHAPE_CLOSE) on widths not yet
        settled is timed again first, within the process's measuring budget (curve.settle)."""
        self._curve = curve.settle_close_call(self.scorer, costs, figures)
        return cost.shape_verdict(self._curve, figures).shape

    def _drafter_source(self) -> tuple[str, PairHead | None]:
        """Which kind of drafter --draft names ("none", "ngram", "head" or "model") and, for a
        head, the head loaded and checked; a draft model is loaded (or shared) and checked here."""
        spec = self.options.drafting.draft
        if spec == "auto":  # the target's draft head when it has one, prompt lookup otherwise
            found = find_head(self.target.fingerprint)
            spec = "ngram" if found is None else f"head:{found}"
        if spec in ("none", "ngram"):
            return spec, None
        if spec == "head" or spec.startswith("head:"):
            return "head", load_head(spec, self.target, self.options.model.allow_pickle)
        shared = self.draft_model is not None and self.draft_model.spec == spec
        # under --dtype auto a draft model takes the dtype measured for its target (not measured itself)
        same_dtype = self.target.dtype if self.options.model.dtype == "auto" else None
        draft = self.draft_model if shared else self.options.model.load(spec, dtype=same_dtype)
        check_same_vocabulary(self.target, draft)
        self.draft_model = draft
        return "model", None

    def _build_drafter(self, kind: str, head: PairHead | None, shape: TreeShape) -> Drafter:
        drafting, sampling = self.options.drafting, self.options.sampling
        if kind == "none":
            return NoDrafter(self.target.device)
        if kind == "ngram":
            return NgramDrafter(self.target.device, shape)
        if kind == "head":
            return HeadDrafter(head, self.target, sampling.params, drafting.head_confidence, compile=self._compiled,
                               shape=shape, lookup=drafting.draft_lookup == "on")
        return ModelDrafter(self.draft_model, sampling.params, shape, compile=self._compiled)

    @property
    def tree(self) -> TreeShape:
        """The drafter's shape (`CHAIN` for a chain or no drafting)."""
        return self.drafter.shape

    # ------------------------------------------------------------------ prompts
    def encode(self, prompt: str) -> list[int]:
        """Apply the chat template when the model has one (unless --raw). A prompt of more bytes
        than the context window could hold at MAX_BYTES_PER_TOKEN is refused before the tokenizer
        sees it (tokenizing 100 MB once took minutes, only to be refused then)."""
        require(prompt.strip() != "", "the prompt is empty")
        window = self.target.context_window
        size = len(prompt.encode("utf-8", "surrogateescape"))
        require(window is None or size <= window * MAX_BYTES_PER_TOKEN,
                f"the prompt has {size} bytes, more than the model's context window ({window} tokens) can hold")
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
        drafting = self.options.drafting
        # a compiled scorer has one graph per width: `auto` then drafts cost.COMPILED_DRAFT tokens or none
        most = cost.COMPILED_DRAFT if drafting.adaptive and self.scorer.compiled else drafting.max_draft
        depth = most if self.tree.topk == 1 or not drafting.adaptive else cost.TREE_DEPTH
        return DecodeSettings(self.options.max_new_tokens, depth, self.options.stop, adaptive_draft=drafting.adaptive,
                              tree_tokens=self.tree.tokens)

    @plan.collected
    def draft_length(self) -> AdaptiveDraftLength | None:
        """`--num-draft auto`: the per-round length chooser, built on first use from the target's
        cost curve (measured once per model, device, dtype and compile mode, then cached). It keeps
        learning this drafter's acceptance across the session's prompts."""
        if isinstance(self.drafter, NoDrafter):
            return None
        if self._draft_length is None:
            if self.tree.topk > 1:  # a tree: its depth (levels searched) or no drafting; its width is fixed
                width = self.tree.tokens + 1
                costs = self._cost_curve((1, width))
                self._draft_length = AdaptiveDraftLength(costs, cost.TREE_DEPTH, cost.TREE_DEPTHS,
                                                         width=lambda k: width)
            elif self.scorer.compiled:
                costs = self._cost_curve(cost.chain_widths(cost.COMPILED_DRAFT, True))
                self._draft_length = AdaptiveDraftLength(costs, cost.COMPILED_DRAFT, lengths=(cost.COMPILED_DRAFT,))
            else:
                costs = self._cost_curve(cost.chain_widths(self.options.drafting.max_draft, False))
                self._draft_length = AdaptiveDraftLength(costs, self.options.drafting.max_draft)
        return self._draft_length

    def as_fresh(self) -> None:
        """Decode the next prompt as a session built for it would: what `--num-draft auto` learnt of
        the drafter's acceptance from earlier prompts is forgotten (the warm server serves one-liners,
        each of which a process of its own would have decoded alone)."""
        self._draft_length = None

    def _cost_curve(self, widths: tuple[int, ...]) -> cost.CostCurve:
        """The target's cost curve with at least `widths`: only what this session reads is
        measured (on first use, within the process's measuring budget), then cached."""
        self._curve = curve.curve_for(self.scorer, widths, known=self._curve)
        return self._curve

    def stream(self, prompt_ids: list[int], stats: DecodeStats,
               observe: Callable[[torch.Tensor], None] | None = None,
               seed: int | None = None, settings: DecodeSettings | None = None, *,
               verifier: Verifier | None = None) -> Iterator[list[int]]:
        """Decode one prompt. `seed` overrides --seed for this call (calibration varies it);
        `settings` overrides the loop settings (profiling sweeps the draft length); `verifier`
        overrides the session's verifier (calibration's sweep varies the rule and threshold)."""
        seed = self.options.sampling.seed if seed is None else seed
        noise = PositionNoise(seed, self.target.vocab_size, self.target.output_device)
        settings = settings or self.settings()
        draft_length = self.draft_length() if settings.adaptive_draft else None
        plan.say_tuning()  # what tuning measured, or found provisional, in one note (once a process)
        verifier = self.verifier if verifier is None else verifier
        tokens = decode(self.scorer, self.drafter, verifier, prompt_ids, settings, noise, stats, observe, draft_length)
        return _torch_on_one_thread(tokens) if self.options.model.engine == "llama.cpp" else tokens

    def check_drift(self, stats: DecodeStats) -> None:
        """After each prompt (`run` calls it; a caller of `stream` does, once its output is out):
        when this session's own target forwards no longer match the cached measurements it decodes
        by, make those entries provisional, with one note (tuning/drift.py)."""
        if self._drift_found or self.options.model.engine == "llama.cpp":  # (its entries: the cost curve only)
            return
        seconds, rounds = self._plain_timed
        self._plain_timed = seconds + stats.phase_s["target"], rounds + stats.rounds
        observed, expected = self._drift_evidence()
        found = drift.ratio(observed, expected)
        if not drift.drifted(found) or machine.busy_reason() is not None:  # a busy machine explains it: keep them
            return
        self._drift_found = True
        entries = plan.entries(self.target, self.packing, self.int8_head,
                               self._draft_length.curve.key if self._draft_length else None)
        changed = set(drift.forget(entries.values(), found))  # type: ignore[arg-type]
        forgotten = [name for name, path in entries.items() if path in changed]
        if forgotten:
            note(drift.describe(found, forgotten))  # type: ignore[arg-type]

    def _drift_evidence(self) -> tuple[dict[int, float], Callable[[int], float | None]]:
        """The session's own milliseconds per target forward by width (once it has timed
        drift.MIN_ROUNDS of them) and what the cached measurement expected at a width: the cost
        curve's point for a session that drafts by the cost model; for plain decoding under
        `--dtype auto`, the chosen dtype's timed step against the session's mean target time."""
        if self._draft_length is not None:
            live, curve = self._draft_length.costs, self._draft_length.curve
            if sum(len(times) for times in live.timed.values()) < drift.MIN_ROUNDS:
                return {}, curve.cost
            return {width: ms for width in live.timed if (ms := live.live(width)) is not None}, curve.cost
        choice = self.target.dtype_choice
        if not isinstance(self.drafter, NoDrafter) or choice is None:
            return {}, lambda width: None
        seconds, rounds = self._plain_timed
        step = next((c.ms_per_step for c in choice.candidates if c.dtype == choice.chosen), None)
        if rounds < drift.MIN_ROUNDS or step is None:
            return {}, lambda width: None
        return {1: 1000 * seconds / rounds}, lambda width: step if width == 1 else None

    def run(self, prompt: str | list[int], observe: Callable[[torch.Tensor], None] | None = None,
            seed: int | None = None, settings: DecodeSettings | None = None, *,
            verifier: Verifier | None = None) -> Result:
        prompt_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        stats = DecodeStats()
        tokens: list[int] = []
        for chunk in self.stream(prompt_ids, stats, observe, seed, settings, verifier=verifier):
            tokens.extend(chunk)
        self.check_drift(stats)
        return Result(self.decode_text(tokens), tokens, stats)

    def decode_text(self, tokens: list[int]) -> str:
        return self.target.tokenizer.decode(tokens, skip_special_tokens=True)

    def tuning_report(self) -> dict[str, object]:
        """What each measured choice decided for this session, and whether it was read from the
        cache, measured now, or is provisional (tuning/choice.py), for --json."""
        dtype_choice = self.target.dtype_choice
        entries = {"dtype": (dtype_choice.chosen, dtype_choice.provenance) if dtype_choice is not None else None,
                   "packed_weights": (self.packing.packed, self.packing.provenance),
                   "int8_head": (self.int8_head.used, self.int8_head.provenance)}
        report: dict[str, object] = {
            name: None if entry is None else {"value": entry[0], "cached": entry[1].cached,
                                              "provisional": entry[1].provisional}
            for name, entry in entries.items()}
        report["packed_weights"]["problem"] = self.packing.problem  # why packing does not apply: nothing measured
        chosen = self.threads_choice
        if chosen is not None:
            report["llamacpp_threads"] = {"value": chosen.threads, "cached": chosen.provenance.cached,
                                          "provisional": chosen.provenance.provisional}
        report["notes"] = plan.tuning_notes(self.target, self.packing, self.int8_head,
                                            self._curve.key if self._curve is not None else None, chosen)
        report["seconds"] = clock.TALLY.seconds
        return report

    def config(self) -> dict[str, object]:
        """Every resolved setting, for --json and reports."""
        resolved = self.options.flat()
        resolved["stop"] = list(self.options.stop)
        resolved.update(
            threshold=self.threshold.value,
            threshold_source=self.threshold.source,
            target_source=self.target.source,
            drafter=self.drafter.name,
            tree_topk=self.tree.topk,
            tree_tokens=self.tree.tokens,
            draft_head=getattr(getattr(self.drafter, "head", None), "source", None),
            device=str(self.target.device),
            dtype=getattr(self.target, "precision", str(self.target.dtype).replace("torch.", "")),
            compiled=self.scorer.compiled,
            packed_weights=self.packing.packed,
            int8_head=self.int8_head.used,
            draft_lookup=bool(getattr(self.drafter, "looks_up", False)),
            torch_version=torch.__version__,
            threads=getattr(self.scorer, "threads", None) or torch.get_num_threads(),
            engine_choice=self.engine_choice.report() if self.engine_choice is not None else None,
            kernels=self._kernel_path(),
        )
        return resolved

    def _kernel_path(self) -> str | None:
        """The instruction set this project's kernels run on, where the target's linears run on
        them (the quantized modes); None elsewhere."""
        from .decoding import kernels
        from .decoding.quantized import ACTIVATION_BITS  # the quantized modes

        return kernels.path() if getattr(self.target, "precision", None) in ACTIVATION_BITS else None


def _torch_on_one_thread(tokens: Iterator[list[int]]) -> Iterator[list[int]]:
    """Decode with torch on one thread while llama.cpp's own threads run the forwards: torch's work
    there is a row or two of logits, and its idle worker threads, spinning beside llama.cpp's,
    took 4.6 ms a token (19.0 against 26.4 ms a token on a loaded AMD EPYC; docs/llamacpp.md)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield from tokens
    finally:
        torch.set_num_threads(previous)
