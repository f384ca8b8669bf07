"""Soak test (not a CI test): long runs in one process, memory sampled as they go.

1. One `generate` call of 4,000 tokens (MARS, n-gram drafter): resident memory and tokens/s per
   block of 500 tokens. Growth should be the KV cache's and slowdown what a longer context explains.
2. An eval of 200 prompts in one process (the built-in suites, cycled): resident memory after
   every prompt. It should plateau.

    python benchmarks/soak.py --out benchmarks/results/soak.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from mars_cli.decoding.stats import DecodeStats
from mars_cli.evaluation.runner import rss_mb
from mars_cli.evaluation.suites import BUILTIN, load_suite
from mars_cli.models import load_model
from mars_cli.options import DecodingOptions
from mars_cli.session import Session

LONG_PROMPT = ("Write a long, detailed story about a lighthouse keeper on a remote island, "
               "told day by day over a whole year.")


def kv_cache_mb(target, tokens: int) -> float:
    """Size of a full-attention KV cache for `tokens` positions, from the model config."""
    config = target.model.config
    heads = getattr(config, "num_key_value_heads", config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    bytes_per = torch.finfo(target.dtype).bits // 8
    return 2 * config.num_hidden_layers * heads * head_dim * tokens * bytes_per / 2**20


def long_generation(target, tokens: int, block: int) -> dict:
    # sampled at a mild temperature (seeded) so the text does not loop; EOS is ignored
    options = DecodingOptions.of(draft="ngram", verify="mars", threshold=0.9, max_new_tokens=tokens,
                                 temperature=0.7, seed=0)
    session = Session(options, target=target)
    stats = DecodeStats()
    samples, produced, start = [], 0, time.perf_counter()
    last_time, last_tokens = start, 0
    prompt_ids = session.encode(LONG_PROMPT)
    settings = dataclasses.replace(session.settings(), ignore_eos=True, record_margins=False)
    for chunk in session.stream(prompt_ids, stats, settings=settings):
        produced += len(chunk)
        if produced - last_tokens >= block:
            now = time.perf_counter()
            samples.append({"tokens": produced, "rss_mb": rss_mb(),
                            "tokens_per_s": (produced - last_tokens) / (now - last_time),
                            "kv_cache_mb": kv_cache_mb(target, len(prompt_ids) + produced)})
            print(f"  {produced} tokens, rss {samples[-1]['rss_mb']:.0f} MB, "
                  f"{samples[-1]['tokens_per_s']:.1f} tok/s", file=sys.stderr, flush=True)
            last_time, last_tokens = now, produced
    return {"new_tokens": produced, "finish_reason": stats.finish_reason, "blocks": samples,
            "wall_s": time.perf_counter() - start, "tau": stats.summary()["mean_accepted"]}


def many_prompts(target, count: int, max_new: int) -> dict:
    prompts = [s for name in BUILTIN for s in load_suite(name).samples]
    session = Session(DecodingOptions.of(draft="ngram", verify="mars", max_new_tokens=max_new), target=target)
    trace = []
    for index in range(count):
        sample = prompts[index % len(prompts)]
        session.run(sample.turns[0])
        trace.append(rss_mb())
        if index % 20 == 19:
            print(f"  {index + 1} prompts, rss {trace[-1]:.0f} MB", file=sys.stderr, flush=True)
    return {"prompts": count, "rss_mb": trace, "first_20_max": max(trace[:20]), "last_20_max": max(trace[-20:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--block", type=int, default=500)
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/soak.json"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    target = load_model("smollm2-135m", device="cpu")
    result = {"command": " ".join(["python"] + sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
              "rss_after_load_mb": rss_mb()}
    print("long generation", file=sys.stderr)
    result["long_generation"] = long_generation(target, args.tokens, args.block)
    print("many prompts", file=sys.stderr)
    result["many_prompts"] = many_prompts(target, args.prompts, args.prompt_tokens)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "many_prompts"}, indent=1))


if __name__ == "__main__":
    main()
