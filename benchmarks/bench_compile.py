"""Static cache and compiled forwards on the embedded model: what compiling costs, and what it buys.

CPU by default.

For each dtype, one child process with an empty inductor cache (a first run on a machine: "cold")
and one reusing that cache (every later run: "warm") measure, on the same prompts:
- compile time of each verification width (the first compiled forward of that width);
- plain decoding tokens/s: eager with the growing cache (today's default), eager with the static
  cache, compiled; and n-gram drafting (k = 4) eager against compiled;
- one target forward's milliseconds by width after 200 cached tokens, eager against compiled;
- the tokens a run must decode before the compile time is won back (plain decoding).
The warm child only times the compiles (everything else does not depend on the cache).
Methods run in the same process on the same prompt, one after the other; nothing is averaged
across processes. Timings are medians of --repeats where repeated.

    python benchmarks/bench_compile.py --out benchmarks/results/compile.json
    python benchmarks/bench_compile.py --dtypes bfloat16 --compiled-widths 1,2,3,4,5,6,7,8 --no-decode \\
        --no-warm --out benchmarks/results/compile-widths.json   # the full compiled curve (slow: ~45 s a width)

Keep the defaults under 8 minutes on 2 CPU threads: each cold compile of SmolLM2-135M takes
about 45 s there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAIN_PROMPT = "Give me three tips for staying focused while studying at home."
DRAFT_PROMPT = ("Rewrite this function with type hints and a docstring:\n\ndef area(w, h):\n    return w * h\n\n"
                "def perimeter(w, h):\n    return 2 * (w + h)")
CONTEXT = 200  # cached tokens before the timed forwards (as the cost model's curve)


def child(args: argparse.Namespace) -> dict:
    """One process: every measurement for one dtype, with whatever inductor cache it was given."""
    import torch

    from mars_cli.tuning.curve import time_widths
    from mars_cli.decoding.drafters import NgramDrafter, NoDrafter
    from mars_cli.decoding.loop import DecodeSettings, decode
    from mars_cli.decoding.target import STATIC_BLOCK, TargetScorer
    from mars_cli.decoding.tree import DraftTree
    from mars_cli.decoding.verifiers import Verifier
    from mars_cli.models import load_model
    from mars_cli.prompts import encode_messages

    torch.set_num_threads(args.threads)
    import torch._dynamo.utils

    start = time.perf_counter()
    target = load_model(args.model, device="cpu", dtype=args.dtype)
    result: dict = {"dtype": args.dtype, "load_s": round(time.perf_counter() - start, 2), "compile_s": {}}

    def encode(text: str) -> list[int]:
        return encode_messages(target.tokenizer, [{"role": "user", "content": text}], False)
    new = args.new_tokens
    plain_prompt, draft_prompt = encode(PLAIN_PROMPT), encode(DRAFT_PROMPT)
    # one static cache for every measurement, sized as a Session sizes it for these prompts and
    # --new-tokens (rounded up to whole blocks): 256 positions for the defaults
    widest = max([*args.eager_widths, *args.compiled_widths, 5])
    needed = max(CONTEXT + widest, max(len(plain_prompt), len(draft_prompt)) + new + 6)
    capacity = -(-needed // STATIC_BLOCK) * STATIC_BLOCK
    headroom = capacity - CONTEXT  # the first start() (CONTEXT tokens) allocates `capacity`

    def timed_decode(scorer: TargetScorer, prompt: list[int], k: int, drafter) -> dict:
        settings = DecodeSettings(new, k, ignore_eos=True)
        begin = time.perf_counter()
        tokens = [t for chunk in decode(scorer, drafter, Verifier("strict"), prompt, settings) for t in chunk]
        seconds = time.perf_counter() - begin
        return {"tokens": tokens, "s": seconds, "tokens_per_s": round(len(tokens) / seconds, 2)}

    def first_call(scorer: TargetScorer, width: int) -> float:
        """Compile `width` (the first compiled forward of that width), timed."""
        ids = torch.randint(0, target.vocab_size, (CONTEXT + width,), generator=torch.Generator().manual_seed(0))
        scorer.start(ids[:CONTEXT])
        begin = time.perf_counter()
        scorer.score(ids[CONTEXT:CONTEXT + 1], DraftTree.chain(ids[CONTEXT + 1:]), width=width)
        seconds = time.perf_counter() - begin
        scorer.rewind(CONTEXT)
        return round(seconds, 2)

    def curve(scorer: TargetScorer, widths: list[int]) -> dict:
        ids = torch.randint(0, target.vocab_size, (CONTEXT + max(widths),), generator=torch.Generator().manual_seed(0))
        scorer.start(ids[:CONTEXT])

        def run(width: int) -> None:
            scorer.score(ids[CONTEXT:CONTEXT + 1], DraftTree.chain(ids[CONTEXT + 1:CONTEXT + width]), width=width)
            scorer.rewind(CONTEXT)

        with torch.inference_mode():
            costs = time_widths(run, widths, args.repeats)
        return {str(w): round(ms, 1) for w, ms in costs.items()}

    eager = TargetScorer(target)
    static = TargetScorer(target, static_cache=True, headroom=headroom)
    compiled = TargetScorer(target, compile=True, headroom=headroom)
    # compile first, each width timed on its own (decoding then runs warm)
    for width in sorted(set(args.compiled_widths) | ({1, 5} if args.decode else set())):
        result["compile_s"][str(width)] = first_call(compiled, width)
    static.start(torch.zeros(CONTEXT, dtype=torch.long))
    result["static_capacity"] = compiled.cache.capacity
    assert static.cache.capacity == compiled.cache.capacity == capacity
    if args.state == "warm":  # the rest does not depend on the inductor cache
        return result

    if args.decode:
        for scorer in (eager, static):  # warm-up: allocation, first-call costs
            timed_decode(scorer, plain_prompt[:8], 1, NoDrafter(target.device))
        plain = {}
        for name, scorer in (("eager_dynamic", eager), ("eager_static", static), ("compiled", compiled)):
            runs = [timed_decode(scorer, plain_prompt, 1, NoDrafter(target.device)) for _ in range(args.repeats)]
            best = sorted(runs, key=lambda r: r["s"])[len(runs) // 2]
            plain[name] = {"tokens_per_s": best["tokens_per_s"], "s": round(best["s"], 2)}
            plain[name]["same_tokens_as_eager"] = best["tokens"] == plain.get("_eager_tokens", best["tokens"])
            plain.setdefault("_eager_tokens", best["tokens"])
        plain.pop("_eager_tokens")
        result["plain"] = plain
        drafted = {}
        for name, scorer in (("eager_dynamic", eager), ("compiled", compiled)):
            run = timed_decode(scorer, draft_prompt, 4, NgramDrafter(target.device, 3, 1))
            drafted[name] = {"tokens_per_s": run["tokens_per_s"], "s": round(run["s"], 2)}
            drafted.setdefault("_tokens", run["tokens"])
            drafted[name]["same_tokens_as_eager"] = run["tokens"] == drafted["_tokens"]
        drafted.pop("_tokens")
        result["ngram_k4"] = drafted
        saved_ms = 1000 / plain["eager_dynamic"]["tokens_per_s"] - 1000 / plain["compiled"]["tokens_per_s"]
        spent = sum(result["compile_s"][str(w)] for w in (1, 5))
        result["plain_ms_saved_per_token"] = round(saved_ms, 2)
        result["break_even_tokens_widths_1_5"] = round(1000 * spent / saved_ms) if saved_ms > 0 else None

    if args.eager_widths:
        result["eager_ms_by_width"] = curve(eager, args.eager_widths)
    if args.compiled_widths:
        result["compiled_ms_by_width"] = curve(compiled, args.compiled_widths)
    counters = torch._dynamo.utils.counters
    result["graph_breaks"] = sum(counters["graph_break"].values())
    result["graphs_compiled"] = counters["stats"]["unique_graphs"]  # one per width when nothing recompiles
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    widths = lambda text: [int(w) for w in text.split(",") if w]  # noqa: E731
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eager-widths", type=widths, default=list(range(1, 9)))
    parser.add_argument("--compiled-widths", type=widths, default=[1, 5],
                        help="compiled widths to time (each one a compile: ~45 s cold on 2 threads)")
    parser.add_argument("--no-decode", dest="decode", action="store_false", help="only the width curves")
    parser.add_argument("--no-warm", dest="warm", action="store_false", help="skip the warm-cache child")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/compile.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.child:
        args.dtype = args.child
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    import torch
    import transformers

    from mars_cli.tuning.machine import cpu_name as _cpu_name

    runs = []
    begin = time.perf_counter()
    for dtype in args.dtypes.split(","):
        with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
            for state in ("cold", "warm") if args.warm else ("cold",):
                command = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--child", dtype,
                           "--state", state]
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                started = time.perf_counter()
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                if done.returncode != 0 or not lines:
                    raise SystemExit(f"child {dtype} ({state}) failed:\n{done.stderr[-3000:]}")
                run = json.loads(lines[-1][len("RESULT "):])
                run.update(inductor_cache=state, process_s=round(time.perf_counter() - started, 1))
                runs.append(run)
                print(json.dumps(run), flush=True)
    document = {
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "model": args.model, "device": "cpu", "cpu": _cpu_name(), "threads": args.threads,
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "new_tokens": args.new_tokens, "repeats": args.repeats, "context": CONTEXT,
        "total_s": round(time.perf_counter() - begin, 1), "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out} in {document['total_s']} s")


if __name__ == "__main__":
    main()
