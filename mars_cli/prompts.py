"""Prompts in one place: chat-template encoding, JSONL prompt sets and held-out splits.

Decoding sessions, calibration and head training all turn text into token ids the same way and
hold out the same kind of subset; this module sits below all of them, so none has to import
another (head data once imported the decoding session just for `encode_messages`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable

from .errors import UserError


def encode_messages(tokenizer: object, messages: list[dict], raw: bool = False) -> list[int]:
    """A conversation through the chat template (plain concatenation without one, or if `raw`)."""
    if raw or not getattr(tokenizer, "chat_template", None):
        return list(tokenizer.encode("\n".join(m["content"] for m in messages)))
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # BatchEncoding in transformers 5
        ids = ids["input_ids"]
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)


Prompt = str | list[dict]  # one user message, or a conversation ending in a user turn


def encode_prompt(tokenizer: object, prompt: Prompt) -> list[int]:
    """A prompt (one user message or a conversation) through the chat template, ready to answer."""
    return encode_messages(tokenizer, prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}])


def load_prompts(path: Path | None, builtin: Path, least: int = 2,
                 conversations: bool = False) -> tuple[list[Prompt], str, str]:
    """(prompts, name, sha256 of the file's bytes). JSONL with a `prompt` field per line (or, where
    `conversations` is allowed, a `messages` list: earlier turns, the target's own answers among
    them, ending in the user turn to answer); `builtin` when no path is given; at least `least`
    prompts (some are held out)."""
    from .inputs import JSONL_LIMIT, decode_utf8, read_bytes

    source = path or builtin
    raw = read_bytes(source, "prompts file", JSONL_LIMIT,
                     missing=f"cannot read prompts file {source}: it does not exist")
    prompts = []
    for number, line in enumerate(decode_utf8(raw, source, "prompts file").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            prompt = record["messages"] if conversations and "messages" in record else record["prompt"]
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):
            wanted = "a 'prompt' or 'messages' field" if conversations else "a 'prompt' field"
            raise UserError(f"{source}: line {number} is not a JSON object with {wanted}") from None
        if isinstance(prompt, list):
            _check_conversation(prompt, f"{source}: line {number}")
        elif not isinstance(prompt, str) or not prompt.strip():
            raise UserError(f"{source}: line {number} has an empty or non-text prompt")
        prompts.append(prompt)
    if len(prompts) < least:
        raise UserError(f"{source}: needs at least {least} prompts (some are held out), found {len(prompts)}")
    name = "builtin" if path is None else str(path)
    return prompts, name, hashlib.sha256(raw).hexdigest()


def _check_conversation(messages: list, where: str) -> None:
    """A `messages` prompt: role/content objects with text, alternating after an optional system
    turn, ending in a user turn (the one the target answers)."""
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if not messages or not all(isinstance(m, dict) and isinstance(m.get("content"), str) and m["content"].strip()
                               for m in messages):
        raise UserError(f"{where}: 'messages' must be a non-empty list of objects with a non-empty 'content'")
    turns = roles[1:] if roles[0] == "system" else roles
    expected = ["user" if i % 2 == 0 else "assistant" for i in range(len(turns))]
    if turns != expected or turns[-1:] != ["user"]:
        raise UserError(f"{where}: 'messages' roles must alternate user/assistant (after an optional system turn) "
                        f"and end with a user turn, got {roles}")


def is_held_out(index: int, every: int) -> bool:
    """The last index of each run of `every` is held out: a fixed, order-independent rule, so a
    resumed or re-run job holds out the same prompts."""
    return index % every == every - 1


def held_out(indices: Iterable[int], every: int) -> tuple[list[int], list[int]]:
    """(kept, held): `indices` split by `is_held_out`, each in its original order."""
    kept: list[int] = []
    held: list[int] = []
    for index in indices:
        (held if is_held_out(index, every) else kept).append(index)
    return kept, held
