"""Self-distillation data for a draft head: the target's own greedy answers and its features.

Two cached stages under the user's cache directory, keyed by the target's fingerprint, the
prompt file's sha256 and the generation length, so a second run (or `--resume` after a kill)
reuses what is there:

1. `generations.jsonl`: one line per prompt, appended batch by batch (a killed run keeps every
   finished batch; a torn last line is ignored on resume).
2. `features.safetensors`: the target's last hidden state (after its final norm, i.e. what its
   LM head reads) at every position of prompt + answer, fp16, from one teacher-forced pass.
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
from ..prompts import encode_messages

HEAD_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "head_prompts.jsonl"
Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass
class Sequence:
    index: int
    prompt_ids: list[int]
    output_ids: list[int]

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids


def data_dir(target: LoadedModel, prompts_sha: str, max_new_tokens: int) -> Path:
    key = hashlib.sha256(f"{target.fingerprint}|{prompts_sha}|{max_new_tokens}".encode()).hexdigest()[:16]
    return cache_dir() / "heads" / "data" / key


def read_generations(path: Path) -> dict[int, Sequence]:
    done: dict[int, Sequence] = {}
    if not path.exists():
        return done
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            done[record["index"]] = Sequence(record["index"], record["prompt_ids"], record["output_ids"])
        except (ValueError, KeyError, TypeError):
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
def generate(target: LoadedModel, prompts: list[str], out_file: Path, max_new_tokens: int,
             batch_size: int, progress: Progress | None = None) -> list[Sequence]:
    """Greedy answers of the target to every prompt, batched (left padding), resumable."""
    tokenizer = target.tokenizer
    encoded = [encode_messages(tokenizer, [{"role": "user", "content": p}]) for p in prompts]
    done = read_generations(out_file)
    todo = sorted((i for i in range(len(prompts)) if i not in done), key=lambda i: len(encoded[i]))
    eos = target.eos_token_ids
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        progress("generate", len(done), len(prompts))
    with out_file.open("a", encoding="utf-8") as stream:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            ids, mask = _padded([encoded[i] for i in batch], pad, target.device, left=True)
            output = target.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                pad_token_id=pad, eos_token_id=sorted(eos) or None,
            )
            for row, index in enumerate(batch):
                answer = _cut_at_eos(output[row, ids.shape[1]:].tolist(), eos, pad)
                done[index] = Sequence(index, encoded[index], answer)
                stream.write(json.dumps({"index": index, "prompt_ids": encoded[index], "output_ids": answer}) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
            if progress:
                progress("generate", len(done), len(prompts))
    return [done[i] for i in range(len(prompts))]


@torch.inference_mode()
def extract_features(target: LoadedModel, sequences: list[Sequence], out_file: Path, batch_size: int,
                     progress: Progress | None = None, layers: FeatureLayers = LAST_LAYER) -> dict[int, torch.Tensor]:
    """The target's features (`layers`, as decoding selects them) at every position, one
    teacher-forced pass (right padding is harmless: attention is causal, so padding after a
    sequence never reaches its positions)."""
    from safetensors.torch import load_file, save_file

    if out_file.exists():
        stored = load_file(str(out_file))
        if all(str(s.index) in stored for s in sequences):
            return {s.index: stored[str(s.index)] for s in sequences}
    features: dict[int, torch.Tensor] = {}
    order = sorted(sequences, key=lambda s: len(s.ids))
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        ids, mask = _padded([s.ids for s in batch], 0, target.device, left=False)
        output = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        hidden = select_features(output.hidden_states, layers)
        for row, sequence in enumerate(batch):
            features[sequence.index] = hidden[row, : len(sequence.ids)].to("cpu", torch.float16).contiguous()
        if progress:
            progress("features", len(features), len(sequences))
    temporary = out_file.with_suffix(".tmp")
    save_file({str(k): v for k, v in features.items()}, str(temporary))
    os.replace(temporary, out_file)
    return features
