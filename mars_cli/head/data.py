"""Self-distillation data for a draft head: the target's own answers and its features.

Two cached stages under the user's cache directory, keyed by the target's fingerprint, the
prompt file's sha256, the answer length and the sampling recipe, so a second run (or `--resume`
after a kill) reuses what is there:

1. `generations.jsonl`: one line per prompt, appended batch by batch (a killed run keeps every
   finished batch; a torn last line is ignored on resume). Each prompt is answered greedily, or,
   for a chosen share of them, sampled (its `mode`), batched with left padding in the target's
   dtype.
2. features: the target's hidden states (the layers the head reads, then the final normed state
   its LM head reads, concatenated) at every position of prompt + answer, fp16, from teacher-forced
   batched passes, written in shards of `SHARD` sequences (a killed run keeps finished shards).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..decoding.target import LAST_LAYER, FeatureLayers, select_features
from ..models import LoadedModel
from ..paths import cache_dir
from ..prompts import Prompt, encode_prompt, is_held_out

HELD_OUT_EVERY = 10  # the answer to every tenth prompt is held out (prompts.is_held_out)
HEAD_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "head_prompts.jsonl"
Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass
class Sequence:
    index: int
    prompt_ids: list[int]
    output_ids: list[int]
    mode: str = "greedy"  # how the target answered: "greedy" or "sampled"

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids


@dataclass(frozen=True)
class Answering:
    """How the target answers the prompts: greedy, except every prompt whose index falls in the
    sampled share, which is sampled at `temperature` / `top_p` from a per-batch seed."""

    max_new_tokens: int = 256
    sampled_share: float = 0.0
    temperature: float = 0.8
    top_p: float = 0.95
    seed: int = 0

    def sampled(self, index: int) -> bool:
        """Spread evenly over the prompt order: prompt i is sampled when floor(i * share) steps,
        unless it is held out. Held-out answers measure what strict greedy decoding accepts, so
        they are always greedy (with the plain rule and a share of 0.5 every held-out prompt, an
        odd index, was sampled, and the held-out figure measured the sampling)."""
        if is_held_out(index, HELD_OUT_EVERY):
            return False
        return int((index + 1) * self.sampled_share) > int(index * self.sampled_share)

    def key(self) -> str:
        if self.sampled_share == 0:
            return str(self.max_new_tokens)  # as before sampling existed: old caches stay valid
        # "held-greedy": caches made when held-out prompts could be sampled are not mixed in
        return f"{self.max_new_tokens}|{self.sampled_share}|{self.temperature}|{self.top_p}|{self.seed}|held-greedy"


NUCLEUS_CANDIDATES = 256  # where the nucleus is looked for first (a row whose top ones fall short is sorted in full)


class NucleusDraw:
    """A logits processor that draws each row's token itself, at `temperature` from the nucleus
    (the smallest set of most likely tokens holding `top_p` of the mass, as transformers' top-p
    and `sampling.process_logits` keep it), and leaves only that token finite, so that greedy
    search emits it. Why: transformers' own sampling sorts the whole vocabulary and draws from
    all of it at every step, two thirds of a sampled step of SmolLM2 at batch 64 on a 2-core CPU;
    the nucleus nearly always lies within the `candidates` most likely tokens, found with a top-k
    (rows where they hold less than `top_p` are sorted in full). The same distribution, drawn
    from `generator`'s stream."""

    def __init__(self, temperature: float, top_p: float, seed: int, candidates: int = NUCLEUS_CANDIDATES) -> None:
        self.temperature, self.top_p, self.seed, self.candidates = temperature, top_p, seed, candidates
        self.generator: torch.Generator | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.generator is None or self.generator.device != scores.device:
            self.generator = torch.Generator(device=scores.device).manual_seed(self.seed)
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        top, ids = probs.topk(min(self.candidates, probs.shape[-1]), dim=-1)  # descending
        short = top.sum(dim=-1) < self.top_p  # the nucleus may reach past the candidates
        if bool(short.any()):
            tokens = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
            tokens[~short] = self._draw(top[~short], ids[~short])
            tokens[short] = self._draw(*probs[short].sort(dim=-1, descending=True))
        else:
            tokens = self._draw(top, ids)
        drawn = torch.full_like(scores, float("-inf"))
        return drawn.scatter_(-1, tokens[:, None], 0.0)

    def _draw(self, descending: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """One token a row from the nucleus of each row's probabilities (sorted descending), by
        inverting the cumulative mass at a uniform draw scaled to the nucleus's mass."""
        cumulative = descending.cumsum(dim=-1)
        size = ((cumulative - descending) < self.top_p).sum(dim=-1, keepdim=True)  # the first always stays
        mass = cumulative.gather(-1, size - 1)
        uniform = torch.rand(mass.shape, generator=self.generator, device=mass.device, dtype=mass.dtype)
        choice = torch.searchsorted(cumulative, uniform * mass, right=True).clamp_(max=size - 1)
        return ids.gather(-1, choice)[:, 0]


SHARD = 512  # sequences per features file


def data_dir(target: LoadedModel, prompts_sha: str, answering: "Answering | int") -> Path:
    if isinstance(answering, int):
        answering = Answering(max_new_tokens=answering)
    key = hashlib.sha256(f"{target.fingerprint}|{prompts_sha}|{answering.key()}".encode()).hexdigest()[:16]
    return cache_dir() / "heads" / "data" / key


def read_generations(path: Path) -> dict[int, Sequence]:
    """The answers already generated (the resume log of the data step). A line that is torn, not
    UTF-8 or not a record is generated again; a file that is not a regular one, or absurdly
    large, is one sentence (a FIFO there would block the run)."""
    from ..inputs import LOG_LIMIT, read_bytes

    done: dict[int, Sequence] = {}
    if not path.exists() and not path.is_symlink():
        return done
    text = read_bytes(path, "generated answers file", LOG_LIMIT).decode("utf-8", errors="replace")
    for line in text.splitlines():
        try:
            record = json.loads(line)
            done[record["index"]] = Sequence(record["index"], record["prompt_ids"], record["output_ids"],
                                             record.get("mode", "greedy"))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            continue  # a line torn by a kill; that prompt is generated again
    return done


def _padded(rows: list[list[int]], pad: int, device: torch.device, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), each [len(rows), longest row]."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, tokens in enumerate(rows):
        span = slice(width - len(tokens), width) if left else slice(0, len(tokens))
        ids[row, span] = torch.tensor(tokens)
        mask[row, span] = 1
    return ids.to(device), mask.to(device)


def _cut_at_eos(tokens: list[int], eos: set[int], pad: int) -> list[int]:
    for position, token in enumerate(tokens):
        if token in eos:
            return tokens[: position + 1]
    # rows that finished early are padded by generate; drop trailing padding
    while tokens and tokens[-1] == pad and pad not in eos:
        tokens = tokens[:-1]
    return tokens


@torch.inference_mode()
def generate(target: LoadedModel, prompts: list[Prompt], out_file: Path, answering: "Answering | int",
             batch_size: int, progress: Progress | None = None,
             select: Callable[[int], bool] | None = None, longest_first: bool = False) -> list[Sequence]:
    """The target's answers to every prompt (greedy, or sampled for `answering`'s share),
    batched with left padding, resumable; batches hold one mode and similar prompt lengths.
    A prompt is one user message or a conversation (`prompts.load_prompts`).
    `select` answers only the prompts it picks (another machine may answer the rest into a
    file that is appended to this one); then only those are returned."""
    from transformers import LogitsProcessorList

    if isinstance(answering, int):
        answering = Answering(max_new_tokens=answering)
    tokenizer = target.tokenizer
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    done = read_generations(out_file)
    todo = sorted((i for i in range(len(prompts)) if i not in done and (select is None or select(i))),
                  key=lambda i: (answering.sampled(i), -len(encoded[i]) if longest_first else len(encoded[i]), i))
    eos = target.eos_token_ids
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        progress("generate", len(done), len(prompts))
    batches: list[list[int]] = []
    for index in todo:  # split where the mode changes, so every batch has one
        if batches and len(batches[-1]) < batch_size and answering.sampled(batches[-1][0]) == answering.sampled(index):
            batches[-1].append(index)
        else:
            batches.append([index])
    with out_file.open("a", encoding="utf-8") as stream:
        for batch in batches:
            sampled = answering.sampled(batch[0])
            ids, mask = _padded([encoded[i] for i in batch], pad, target.device, left=True)
            options: dict = {"do_sample": False}
            if sampled:  # reproducible: the seed depends on the batch's first prompt only
                draw = NucleusDraw(answering.temperature, answering.top_p, answering.seed * 1_000_003 + batch[0])
                options["logits_processor"] = LogitsProcessorList([draw])
            output = target.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=answering.max_new_tokens,
                pad_token_id=pad, eos_token_id=sorted(eos) or None, **options,
            )
            for row, index in enumerate(batch):
                answer = _cut_at_eos(output[row, ids.shape[1]:].tolist(), eos, pad)
                done[index] = Sequence(index, encoded[index], answer, "sampled" if sampled else "greedy")
                stream.write(json.dumps({"index": index, "mode": "sampled" if sampled else "greedy",
                                         "prompt_ids": encoded[index], "output_ids": answer}) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
            if progress:
                progress("generate", len(done), len(prompts))
    return [done[i] for i in range(len(prompts)) if i in done]


@torch.inference_mode()
def extract_features(target: LoadedModel, sequences: list[Sequence], folder: Path, batch_size: int,
                     progress: Progress | None = None, layers: FeatureLayers = LAST_LAYER,
                     known: dict[int, torch.Tensor] | None = None) -> dict[int, torch.Tensor]:
    """The target's features (`layers`, as decoding selects them, concatenated) at every
    position, from teacher-forced batched passes (right padding is harmless: attention is causal,
    so padding after a sequence never reaches its positions). Shards of SHARD sequences under
    `folder`; finished shards are reused. `known`: features already extracted for some of these
    very sequences (same index, same ids: the caller checks), taken instead of a forward, so
    pooling new answers with old ones extracts only the new ones."""
    from safetensors.torch import load_file, save_file

    from ..paths import saving

    folder.mkdir(parents=True, exist_ok=True)
    known = known or {}
    features: dict[int, torch.Tensor] = {}
    shards = [sequences[start : start + SHARD] for start in range(0, len(sequences), SHARD)]
    for number, shard in enumerate(shards):
        path = folder / f"shard-{number:05d}-{len(shard)}.safetensors"
        if path.exists():
            try:
                stored = load_file(str(path))
            except Exception:  # a damaged cache shard (safetensors raises its own types): extracted again
                stored = {}
            if all(str(s.index) in stored for s in shard):
                features.update({s.index: stored[str(s.index)] for s in shard})
                if progress:
                    progress("features", len(features), len(sequences))
                continue
        found = {s.index: known[s.index] for s in shard
                 if s.index in known and known[s.index].shape[0] == len(s.ids)}
        order = sorted((s for s in shard if s.index not in found), key=lambda s: len(s.ids))
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            ids, mask = _padded([s.ids for s in batch], 0, target.device, left=False)
            output = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
            hidden = select_features(output.hidden_states, layers)
            for row, sequence in enumerate(batch):
                found[sequence.index] = hidden[row, : len(sequence.ids)].to("cpu", torch.float16).contiguous()
            if progress:
                progress("features", len(features) + len(found), len(sequences))
        temporary = path.with_suffix(".tmp")
        with saving(path, temporary):
            save_file({str(k): v for k, v in found.items()}, str(temporary))
        os.replace(temporary, path)
        features.update(found)
    return features
