"""`mars eval --engine vllm`: the same suites, methods, quality metrics, gates and reports as
`mars eval`, decoded by vLLM in batches of --batch-size samples.

One engine per drafter (vanilla's has none), all alive at once, so methods interleave batch by
batch as they do sample by sample in our own loop; strict, MARS and every swept theta share
their drafter's engine and switch its rule between batches (plugin.MarsWorkerExtension). A batch's
wall time is shared among its samples by their new tokens, so a method's tokens/s is its batches'
throughput; MARS's own counts (relaxed acceptances, low-margin positions) come per batch from the
plugin and are shared by accepted drafts. Records go to samples.jsonl like our own, so the table,
report, plots and gates are the same code."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UserError, require
from ..evaluation.methods import Method
from ..evaluation.runner import SampleLog, _trim_at_stop_string, rss_mb, task_score
from ..evaluation.suites import Sample, Suite
from ..notes import note
from ..options import DecodingOptions
from . import memory, settings
from .engine import EngineSpec, build_llm, target_directory

DEFAULT_NUM_DRAFT = 3  # vLLM drafts a fixed number per round; `--num-draft auto` takes this


@dataclass
class Engines:
    """The engines of one run (by drafter), and each method's rule on its engine."""

    by_drafter: dict[str, Any]
    drafter_of: dict[str, str]  # method -> drafter
    rule_of: dict[str, dict | None]  # method -> resolved MARS mapping, None for strict (and vanilla)
    spec_of: dict[str, EngineSpec]

    def shutdown(self) -> None:
        for llm in self.by_drafter.values():
            llm.llm_engine.engine_core.shutdown()


def check_methods(methods: list[Method]) -> None:
    """vLLM drafts chains: a method with a tree shape is refused before any engine starts."""
    for method in methods:
        require("draft_topk" not in method.changes and "draft_tokens" not in method.changes,
                f"method {method.name!r}: --engine vllm drafts chains (vLLM has no draft trees); drop its +SHAPE")


def start_engines(methods: list[Method], options: DecodingOptions, enforce_eager: bool) -> Engines:
    """Resolve each method's drafter and rule, then start one engine per drafter."""
    check_methods(methods)
    num_draft = options.drafting.num_draft
    if not isinstance(num_draft, int):
        note(f"--num-draft {num_draft}: vLLM drafts a fixed number per round; using {DEFAULT_NUM_DRAFT}", once=True)
        num_draft = DEFAULT_NUM_DRAFT
    dtype = options.model.dtype if options.model.dtype != "auto" else "float32"
    target_dir = target_directory(options.model.target)
    drafter_of, rule_of = {}, {}
    for method in methods:
        changed = options.replace(**method.changes)
        drafter = changed.drafting.draft
        drafter_of[method.name] = "none" if drafter == "none" else ("head" if drafter == "auto" else drafter)
        rule_of[method.name] = _rule(changed, target_dir) if changed.verification.verify == "mars" else None
    extra = {"enforce_eager": enforce_eager, "max_num_seqs": 256}
    drafters = list(dict.fromkeys(drafter_of.values()))
    kv_cache = memory.plan_kv_cache(target_dir, [target_directory(d) for d in drafters if _is_draft_model(d)], dtype,
                                    _max_model_len(options), len(drafters))
    if kv_cache is not None:  # on a CPU: sized from the memory at hand, shared by the run's engines
        extra["kv_cache_memory_bytes"], line = kv_cache
        note(line)
    specs = {drafter: EngineSpec(options.model.target, drafter, num_draft, dtype, _max_model_len(options),
                                 options.sampling.seed or 0, extra) for drafter in drafters}
    engines = Engines({}, drafter_of, rule_of, specs)
    try:
        for drafter, spec in specs.items():
            try:
                engines.by_drafter[drafter] = build_llm(spec, None)
            except Exception as exc:  # noqa: BLE001 - vLLM reports a failed start as a bare RuntimeError
                if isinstance(exc, UserError):
                    raise
                raise memory.start_failure(f"for --draft {drafter}", exc) from None
    except BaseException:
        engines.shutdown()
        raise
    return engines


def _is_draft_model(drafter: str) -> bool:
    """A drafter that is a model of its own (its weights count against memory), not none, n-gram or a head."""
    return drafter not in ("none", "ngram") and drafter.partition(":")[0] != "head"


def _rule(options: DecodingOptions, target_dir: str) -> dict:
    """A MARS method's thresholds, resolved as `mars generate` resolves them (flag, profile, auto)."""
    return settings.resolve(settings.mapping_for(options.verification), target_dir, speculative=True)


def _max_model_len(options: DecodingOptions) -> int:
    return 2048 + options.max_new_tokens  # room for the suites' prompts (a few hundred tokens) and answers


def evaluate(suites: list[Suite], methods: list[Method], options: DecodingOptions, engines: Engines,
             log: SampleLog, batch_size: int, allow_execution: bool, advance: Callable[[str], None],
             strict_sandbox: bool = True) -> None:
    """Run everything not yet in the log, batch by batch (consecutive samples, across suites);
    methods rotate per batch."""
    done = log.done()
    warmed: set[str] = set()
    pairs = [(suite, sample) for suite in suites for sample in suite.samples]
    batches = [pairs[i : i + batch_size] for i in range(0, len(pairs), batch_size)]
    for index, batch in enumerate(batches):
        order = methods[index % len(methods):] + methods[:index % len(methods)]
        for method in order:
            todo = [(suite, s) for suite, s in batch if (suite.name, s.id, method.name) not in done]
            for _ in range(len(batch) - len(todo)):
                advance(method.name)
            if not todo:
                continue
            llm = engines.by_drafter[engines.drafter_of[method.name]]
            rule = engines.rule_of[method.name]
            if method.name not in warmed:  # first calls pay for allocation: keep them out of timings
                _generate(llm, rule, [todo[0][1]], options, max_tokens=4)
                warmed.add(method.name)
            for (suite, sample), record in zip(todo, _generate(llm, rule, [s for _, s in todo], options)):
                record.pop("sample")
                record.update(suite=suite.name, sample_id=sample.id, method=method.name, rss_mb=rss_mb(),
                              task_score=task_score(suite, sample, record["output"], allow_execution, strict_sandbox))
                log.append(record)
                advance(method.name)


def _generate(llm, rule: dict | None, samples: list[Sample], options: DecodingOptions,
              max_tokens: int | None = None) -> list[dict]:
    """Decode a batch turn by turn (every sample's first turns together, then their second ...),
    under `rule`; one record per sample."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    speculative = llm.llm_engine.vllm_config.speculative_config is not None
    if speculative:
        llm.collective_rpc("mars_set_thresholds", args=(rule,))
        llm.collective_rpc("mars_reset_counters")
    tokenizer = llm.get_tokenizer()
    sampling = options.sampling
    conversations: list[list[dict]] = [[] for _ in samples]
    records = [_empty_record(sample) for sample in samples]
    wall = 0.0
    for turn in range(max(len(sample.turns) for sample in samples)):
        active = [i for i, sample in enumerate(samples) if turn < len(sample.turns)]
        prompts = []
        for i in active:
            conversations[i].append({"role": "user", "content": samples[i].turns[turn]})
            prompts.append(TokensPrompt(prompt_token_ids=_encode(tokenizer, samples[i], conversations[i])))
        params = [SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or -1,
                                 seed=None if sampling.seed is None else sampling.seed + i, logprobs=0,
                                 max_tokens=max_tokens or options.max_new_tokens,
                                 stop=list(samples[i].stop or options.stop) or None)
                  for i in active]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        wall += time.perf_counter() - start
        for i, output in zip(active, outputs):
            _add_turn(records[i], output.outputs[0], samples[i].stop or options.stop)
            conversations[i].append({"role": "assistant", "content": records[i]["turns"][-1]})
    counts = llm.collective_rpc("mars_counters")[0] if speculative else {}
    _share(records, wall, counts)
    return records


def _encode(tokenizer, sample: Sample, messages: list[dict]) -> list[int]:
    """As our own runner: completion prompts (HumanEval) raw, everything else through the chat template."""
    if sample.raw:
        return tokenizer.encode(messages[-1]["content"])
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def _empty_record(sample: Sample) -> dict:
    return {"sample": sample, "turns": [], "token_ids": [], "new_tokens": 0, "rounds": 0, "drafted": 0,
            "accepted": 0, "relaxed": 0, "low_margin": 0, "examined": 0, "drafted_at": [], "accepted_at": [],
            "sum_logprob": 0.0, "accepted_per_round": {}}


def _add_turn(record: dict, completion, stops: tuple[str, ...]) -> None:
    """One turn's completion into its sample's record: text, tokens, logprob and acceptance."""
    record["turns"].append(_trim_at_stop_string(completion.text, tuple(stops)))
    record["token_ids"] += list(completion.token_ids)
    record["new_tokens"] += len(completion.token_ids)
    record["sum_logprob"] += sum(top[token].logprob for token, top in zip(completion.token_ids, completion.logprobs or [])
                                 if top and token in top)
    metrics = completion.spec_decode_metrics
    if metrics is None:  # vanilla: one target forward per token
        record["rounds"] += len(completion.token_ids)
        return
    histogram = list(metrics.histogram)
    rounds = sum(histogram)  # verification rounds; steps without a draft (n-gram found none) are not in it
    emitted_by_rounds = sum((j + 1) * n for j, n in enumerate(histogram))
    record["rounds"] += rounds + max(0, len(completion.token_ids) - emitted_by_rounds)
    record["drafted"] += metrics.num_draft_tokens
    record["accepted"] += sum(j * n for j, n in enumerate(histogram))
    for j, n in enumerate(histogram):
        key = str(j)
        record["accepted_per_round"][key] = record["accepted_per_round"].get(key, 0) + n
    # per position: every round drafts up to k; position i is accepted in rounds with more than i
    k = len(histogram) - 1
    drafted_at = [rounds] * k
    accepted_at = [sum(histogram[i + 1 :]) for i in range(k)]
    record["drafted_at"] = [a + b for a, b in zip(record["drafted_at"] or [0] * k, drafted_at)]
    record["accepted_at"] = [a + b for a, b in zip(record["accepted_at"] or [0] * k, accepted_at)]


def _share(records: list[dict], wall: float, counts: dict[str, int]) -> None:
    """A batch's wall time by new tokens, and MARS's batch counts by accepted drafts, so sums over
    samples are the batch's."""
    tokens = sum(r["new_tokens"] for r in records) or 1
    accepted = sum(r["accepted"] for r in records)
    for name in ("relaxed", "low_margin", "examined"):
        total, given = counts.get(name, 0), 0
        for index, record in enumerate(records):
            last = index == len(records) - 1
            share = total - given if last else (round(total * record["accepted"] / accepted) if accepted else 0)
            record[name] = share
            given += share
    for record in records:
        record["wall_s"] = wall * record["new_tokens"] / tokens
        record["walls"] = [record["wall_s"]]
        record["output"] = "\n".join(record["turns"]) if len(record["turns"]) > 1 else record["turns"][0]
        record["turns"] = record["turns"] if len(record["turns"]) > 1 else None
        record["mean_accepted"] = record["accepted"] / record["rounds"] if record["rounds"] else 0.0


def describe(engines: Engines, methods: list[Method], options: DecodingOptions, batch_size: int) -> tuple[dict, dict]:
    """(config, per-method details) for the results document, as describe_sessions gives for ours."""
    import torch
    import vllm

    drafted = next((m for m in methods if engines.drafter_of[m.name] != "none"), methods[0])
    spec = engines.spec_of[engines.drafter_of[drafted.name]]
    config = {**options.flat(), "engine": f"vllm {vllm.__version__}", "drafter": spec.draft,
              "num_draft": spec.num_draft, "dtype": spec.dtype, "target_dir": target_directory(spec.target),
              "batch_size": batch_size, "torch_version": torch.__version__, "threads": torch.get_num_threads()}
    details = {}
    for method in methods:
        rule = engines.rule_of[method.name]
        extra = {} if rule is None else {"threshold": rule["greedy"] if options.sampling.temperature == 0
                                         else rule["sampled"], "threshold_source": rule["source"],
                                         "measure": rule["measure"]}
        details[method.name] = {**method.changes, "drafter": engines.drafter_of[method.name], **extra}
    return config, details


def check_engine_options(options: DecodingOptions, batch_size: int) -> None:
    """What --engine vllm cannot honour, refused in one line before anything starts."""
    require(batch_size >= 1, f"--batch-size must be at least 1, got {batch_size}")
    require(options.model.device in ("auto", "cpu", "cuda"), "--engine vllm places the model itself: drop --device")
    require(options.model.device_map is None,
            "--engine vllm spreads a target with its own parallelism (see `mars serve --tensor-parallel-size`)")
    if options.model.trust_remote_code:
        raise UserError("--engine vllm does not pass --trust-remote-code on")
