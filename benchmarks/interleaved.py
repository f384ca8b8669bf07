"""Methods side by side in one process, rotated prompt by prompt (bench_llamacpp.py, bench_gpu_default.py).

Each method a `Session` of its own options, the same held-out prompts, fixed-length decodes,
methods rotated prompt by prompt after a warm-up. A module, not a command: imported by
bench_llamacpp.py and bench_gpu_default.py.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mars_cli.evaluation.suites import load_suite  # noqa: E402
from mars_cli.options import DecodingOptions  # noqa: E402
from mars_cli.session import Session  # noqa: E402


def held_out_prompts(count: int) -> list[str]:
    """Chat, code and multiturn first turns, in turn."""
    suites = [load_suite(name).samples for name in ("chat", "code", "multiturn")]
    return [suites[i % 3][i // 3 % len(suites[i % 3])].turns[0] for i in range(count)]


def decode_rate(session: Session, prompt: str, new_tokens: int) -> dict:
    """One decode of exactly `new_tokens` (past EOS): tokens/s after the prefill, tau, and where
    the round's time went (the drafting share among them)."""
    settings = dataclasses.replace(session.settings(), max_new_tokens=new_tokens, ignore_eos=True)
    result = session.run(prompt, settings=settings)
    stats = result.stats
    decoding = stats.wall_s - stats.phase_s.get("prefill", 0.0)
    return {"new_tokens": stats.new_tokens, "decode_s": decoding, "tau": stats.new_tokens / max(stats.rounds, 1),
            "draft_share": stats.phase_s.get("draft", 0.0) / decoding if decoding > 0 else 0.0,
            "tokens": result.token_ids}


def run_methods(methods: dict[str, dict], prompts: list[str], new_tokens: int, common: dict,
                between: Callable[[], None] = lambda: None) -> tuple[dict[str, Session], dict[str, list[dict]]]:
    """Build a session per method (`common` options plus its own), warm each up on the first
    prompt, then decode every prompt with every method, the order rotated each prompt; `between`
    runs after each round of prompts (an outside tool, interleaved too)."""
    sessions = {name: Session(DecodingOptions.of(**{**common, "max_new_tokens": new_tokens, **options}))
                for name, options in methods.items()}
    for session in sessions.values():
        decode_rate(session, prompts[0], new_tokens)
    names = list(methods)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for index, prompt in enumerate(prompts):
        for name in names[index % len(names):] + names[: index % len(names)]:
            runs[name].append(decode_rate(sessions[name], prompt, new_tokens))
        between()
    return sessions, runs


def summary(rows: list[dict]) -> dict:
    """A method's tokens/s over all its decodes, mean tau and mean drafting share."""
    tokens = sum(r["new_tokens"] for r in rows)
    seconds = sum(r["decode_s"] for r in rows)
    return {"tokens_per_s": tokens / seconds, "tau": statistics.mean(r["tau"] for r in rows),
            "draft_share": statistics.mean(r["draft_share"] for r in rows)}
