"""Writes a prompt set the target writes itself (issue 27, step 17): its own user turns.

Steps 14-16 brought new kinds of text (documentation, library code, function tasks made from
docstrings); each gained held out on its own kind and nothing on the suites. The suites ask what
a chat model's users ask, and the target learnt what its users ask during its instruction
tuning. Fed its chat template up to an open user turn (the default system prompt, then
`<|im_start|>user\\n`), an instruction-tuned model samples a user request of the kind it was tuned
on (the Magpie recipe, Xu et al. 2024). An opening can be put in the user's mouth
(`Write a Python function \\``) to steer a share of the requests towards a kind.

Each kind is `name:count:opening` (`--kinds`); requests are sampled at `--temperature` in
batches, kept when the target closed the turn itself within `--max-new-tokens`, between 4 and
120 words, with no template marker inside; the same check as the other sets drops duplicates and
anything equal to or containing an eval-suite, calibration or benchmark prompt. Reproducible from
the seed on the same CPU and torch (sampling draws from torch's generator).

    python benchmarks/tools/make_magpie_prompts.py --out prompts-step17.jsonl
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_varied_prompts import write_prompt_set  # noqa: E402

DEFAULT_KINDS = "chat:1400:,code:400:Write a Python function `,writing:300:Write a "
WORDS = (4, 120)
MARKER = "<|im_"


def parse_kinds(text: str) -> list[tuple[str, int, str]]:
    """"chat:1400:,code:400:Write a Python function `" -> [(name, count, opening), ...]. The
    opening may hold colons (only the first two split); a comma ends a kind."""
    kinds = []
    for part in text.split(","):
        name, count, opening = part.split(":", 2)
        kinds.append((name, int(count), opening))
    return kinds


def user_prefix(tokenizer) -> str:
    """The chat template's text before a user turn's content (with its default system prompt)."""
    marker = "\x00MARK\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return text[: text.index(marker)]


def sample_requests(model, tokenizer, prefix: str, opening: str, count: int, batch: int,
                    max_new_tokens: int, temperature: float, end_ids: set[int]) -> list[str]:
    """`count` sampled user turns that begin with `opening` and that the model closed itself."""
    ids = tokenizer(prefix + opening, return_tensors="pt", add_special_tokens=False).input_ids
    kept: list[str] = []
    tries = 0
    while len(kept) < count and tries < 4 * count:
        rows = ids.repeat(batch, 1)
        out = model.generate(rows, attention_mask=torch.ones_like(rows), do_sample=True, temperature=temperature,
                             top_p=1.0, top_k=0, max_new_tokens=max_new_tokens, pad_token_id=min(end_ids))
        tries += batch
        for row in out[:, ids.shape[1]:].tolist():
            ends = [i for i, token in enumerate(row) if token in end_ids]
            if not ends:
                continue  # the request ran past the budget: not a finished turn
            text = (opening + tokenizer.decode(row[: ends[0]])).strip()
            if MARKER not in text and WORDS[0] <= len(text.split()) <= WORDS[1]:
                kept.append(text)
    return kept[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--kinds", default=DEFAULT_KINDS, help="name:count:opening, comma-separated")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seed", type=int, default=2033)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from mars_cli.models import load_model

    target = load_model(args.target, device="cpu", dtype=args.dtype)
    torch.manual_seed(args.seed)
    prefix = user_prefix(target.tokenizer)
    rows = []
    for name, count, opening in parse_kinds(args.kinds):
        started = time.perf_counter()
        with torch.inference_mode():
            requests = sample_requests(target.model, target.tokenizer, prefix, opening, count, args.batch,
                                       args.max_new_tokens, args.temperature, target.eos_token_ids)
        print(f"{name}: {len(requests)} requests in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        rows += [(name, text) for text in requests]
    write_prompt_set(rows, random.Random(args.seed), args.out, "headM")


if __name__ == "__main__":
    main()
