"""GPU benchmark: eager against compiled forwards and decoding, and our loop against `generate`.

Compiled: static cache + CUDA graphs; in bfloat16 on one CUDA device.

Two parts, so that the timing part needs no weights (a model's speed depends on its shape, not on
its values; a GPU machine may only receive the embedded GGUF in pieces):

    # a random model of a real shape: forward ms by width (eager and compiled, with each width's
    # compile time), and plain decoding (ours eager, ours compiled, transformers' generate)
    python benchmarks/bench_gpu.py curves --shape smollm2-135m --out gpu-curves.json
    # the embedded model: plain and speculative decoding, eager and compiled, interleaved per
    # prompt, against transformers' generate; identity with its greedy output
    python benchmarks/bench_gpu.py decode --out gpu-decode.json

Every part stops starting new stages once `--budget-s` has passed and writes what it has (the
JSON is rewritten after every stage), so a run cut short by its machine still reports. On a CPU
(`--device cpu`, tiny shape) the same code runs, to test the script before a GPU is lent.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

from mars_cli.tuning.curve import time_widths
from mars_cli.decoding.drafters import NoDrafter
from mars_cli.decoding.loop import DecodeSettings, decode
from mars_cli.decoding.target import STATIC_BLOCK, TargetScorer
from mars_cli.decoding.tree import DraftTree
from mars_cli.decoding.verifiers import Verifier
from mars_cli.models import LoadedModel, load_model

# the shapes of the embedded model and of its largest sibling (config.json of the public checkpoints)
SHAPES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, rope_theta=100000.0),
    "smollm2-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                         num_key_value_heads=32, rope_theta=130000.0),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, rope_theta=10000.0),  # for a CPU check of this script
}
CONTEXT = 200  # cached tokens before a timed forward (as the cost model's curve)

PROMPTS = {  # as benchmarks/bench_decoding.py
    "chat": "Give me three tips for staying focused while studying at home.",
    "chat2": "What is the difference between weather and climate? Answer briefly.",
    "code": "Write a Python function `is_palindrome(s)` that ignores case and spaces, with a docstring and two examples.",
    "code2": "Rewrite this function with type hints and a docstring:\n\ndef area(w, h):\n    return w * h\n\n"
             "def perimeter(w, h):\n    return 2 * (w + h)",
    "math": "A shop sells pencils at 3 for $1. How much do 12 pencils cost? Explain step by step.",
}


class Report:
    """The result document, rewritten to disk after every stage; stages stop once over budget."""

    def __init__(self, path: Path, budget_s: float, **header: object) -> None:
        self.path, self.budget_s, self.begin = path, budget_s, time.perf_counter()
        self.document: dict = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
                               **environment(), **header, "skipped": []}
        self.save()

    def time_left(self, stage: str) -> bool:
        if time.perf_counter() - self.begin < self.budget_s:
            print(f"[{time.perf_counter() - self.begin:6.1f} s] {stage}", file=sys.stderr, flush=True)
            return True
        self.document["skipped"].append(stage)
        return False

    def add(self, key: str, value: object) -> None:
        self.document[key] = value
        self.document["elapsed_s"] = round(time.perf_counter() - self.begin, 1)
        self.save()
        print(f"{key}: {json.dumps(value)[:600]}", file=sys.stderr, flush=True)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.document, indent=1))


def environment() -> dict:
    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(0) if cuda else None, "cpu": platform.processor() or platform.machine()}


def synchronizer(device: torch.device):
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def random_model(shape: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """A randomly initialised Llama of a named shape (timing only: no tokenizer, no meaning)."""
    config = transformers.LlamaConfig(vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True,
                                      rms_norm_eps=1e-5, **SHAPES[shape])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    return LoadedModel(spec=f"random:{shape}", source="random", model=model, tokenizer=None, device=device, dtype=dtype)


def width_curve(scorer: TargetScorer, widths: list[int], repeats: int) -> dict[str, float]:
    """Milliseconds of one forward of each width after CONTEXT cached tokens (medians, interleaved)."""
    vocab = scorer.target.model.config.vocab_size
    ids = torch.randint(0, vocab, (CONTEXT + max(widths),), generator=torch.Generator().manual_seed(0))
    ids = ids.to(scorer.target.device)
    scorer.start(ids[:CONTEXT])

    def run(width: int) -> None:
        scorer.score(ids[CONTEXT:CONTEXT + 1], DraftTree.chain(ids[CONTEXT + 1:CONTEXT + width]), width=width)
        scorer.rewind(CONTEXT)

    with torch.inference_mode():
        costs = time_widths(run, widths, repeats, synchronizer(scorer.target.device))
    return {str(w): round(ms, 2) for w, ms in costs.items()}


def first_call_s(scorer: TargetScorer, width: int) -> float:
    """Seconds of the first forward of `width` through a compiled scorer: its compile (and capture)."""
    vocab = scorer.target.model.config.vocab_size
    ids = torch.randint(0, vocab, (CONTEXT + width,), generator=torch.Generator().manual_seed(1))
    ids = ids.to(scorer.target.device)
    scorer.start(ids[:CONTEXT])
    begin = time.perf_counter()
    scorer.score(ids[CONTEXT:CONTEXT + 1], DraftTree.chain(ids[CONTEXT + 1:]), width=width)
    synchronizer(scorer.target.device)()
    seconds = time.perf_counter() - begin
    scorer.rewind(CONTEXT)
    return round(seconds, 2)


def plain_decode(scorer: TargetScorer, prompt: list[int], new_tokens: int) -> tuple[list[int], float]:
    """Our loop, no drafter, exactly `new_tokens` tokens (EOS ignored): tokens and seconds."""
    settings = DecodeSettings(new_tokens, 1, ignore_eos=True)
    begin = time.perf_counter()
    tokens = [t for chunk in decode(scorer, NoDrafter(scorer.target.device), Verifier("strict"), prompt, settings)
              for t in chunk]
    return tokens, time.perf_counter() - begin


def hf_generate(target: LoadedModel, prompt: list[int], new_tokens: int, exact: bool, **extra) -> tuple[list[int], float]:
    """transformers' greedy `generate` (eager, dynamic cache unless `extra` says otherwise);
    `exact` forces exactly `new_tokens` tokens (EOS ignored), as `plain_decode`."""
    ids = torch.tensor([prompt], device=target.device)
    lengths = {"min_new_tokens": new_tokens} if exact else {}
    pad = getattr(target.tokenizer, "eos_token_id", None) or 0
    begin = time.perf_counter()
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                                pad_token_id=pad, **lengths, **extra)
    tokens = out[0, len(prompt):].tolist()
    return tokens, time.perf_counter() - begin


def rate(runs: list[tuple[list[int], float]]) -> float:
    return round(sum(len(tokens) for tokens, _ in runs) / sum(seconds for _, seconds in runs), 2)


# ----------------------------------------------------------------------------------------- curves
def curves(args: argparse.Namespace) -> None:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    report = Report(args.out, args.budget_s, part="curves", shape=args.shape, dtype=args.dtype, context=CONTEXT,
                    new_tokens=args.new_tokens, repeats=args.repeats)
    target = random_model(args.shape, device, dtype)
    widest = max(args.eager_widths + args.compiled_widths)
    capacity = -(-max(CONTEXT + widest, args.prompt_tokens + args.new_tokens + 8) // STATIC_BLOCK) * STATIC_BLOCK
    headroom = capacity - CONTEXT  # the first start() (CONTEXT tokens) allocates `capacity`
    eager = TargetScorer(target)
    static = TargetScorer(target, static_cache=True, headroom=headroom)
    compiled = TargetScorer(target, static_cache=True, compile=True, headroom=headroom)
    report.add("static_capacity", capacity)

    if report.time_left("eager curve"):
        report.add("eager_ms_by_width", width_curve(eager, args.eager_widths, args.repeats))
        report.add("eager_static_ms_by_width", width_curve(static, args.eager_widths, args.repeats))
    compile_s: dict[str, float] = {}
    for width in args.compiled_widths:
        if not report.time_left(f"compile width {width}"):
            break
        compile_s[str(width)] = first_call_s(compiled, width)
        report.add("compile_s", compile_s)
    if report.time_left("compiled curve"):
        done = [int(w) for w in compile_s]
        report.add("compiled_ms_by_width", width_curve(compiled, done, args.repeats))

    if 1 in [int(w) for w in compile_s] and report.time_left("plain decoding"):
        generator = torch.Generator().manual_seed(2)
        prompts = [torch.randint(0, 49152, (args.prompt_tokens,), generator=generator).tolist()
                   for _ in range(args.prompts)]
        methods = {"hf-generate": lambda p: hf_generate(target, p, args.new_tokens, exact=True),
                   "eager": lambda p: plain_decode(eager, p, args.new_tokens),
                   "eager-static": lambda p: plain_decode(static, p, args.new_tokens),
                   "compiled": lambda p: plain_decode(compiled, p, args.new_tokens)}
        for run in methods.values():  # warm-up
            run(prompts[0][:8])
        runs: dict[str, list] = {name: [] for name in methods}
        for index, prompt in enumerate(prompts):
            order = list(methods) if index % 2 == 0 else list(reversed(methods))  # A B / B A
            for name in order:
                runs[name].append(methods[name](prompt))
        rates = {name: rate(found) for name, found in runs.items()}
        report.add("plain_tokens_per_s", rates)
        report.add("plain_speedup_vs_hf_generate", {n: round(r / rates["hf-generate"], 3) for n, r in rates.items()})
        report.add("plain_same_tokens_as_eager",
                   {n: all(a[0] == b[0] for a, b in zip(found, runs["eager"])) for n, found in runs.items()})
        eager_ms = 1000 / rates["eager"] - 1000 / rates["compiled"]
        if eager_ms > 0:
            spent = sum(compile_s.get(str(w), 0.0) for w in (1, 5))
            report.add("break_even_tokens_widths_1_5", round(1000 * spent / eager_ms))

    if args.hf_static and report.time_left("hf generate, static cache compiled"):
        prompt = list(range(100, 100 + args.prompt_tokens))
        config = dict(cache_implementation="static")
        begin = time.perf_counter()
        hf_generate(target, prompt, args.new_tokens, exact=True, **config)  # compiles
        first = time.perf_counter() - begin
        found = [hf_generate(target, prompt, args.new_tokens, exact=True, **config) for _ in range(2)]
        report.add("hf_generate_static_compiled", {"first_call_s": round(first, 1), "tokens_per_s": rate(found)})


# ----------------------------------------------------------------------------------------- decode
DECODE_METHODS = {  # name -> (kind, options); chains are explicit (--draft-topk 1), trees 4 x 16
    "hf-generate": ("hf", {}),
    "plain": ("ours", {"draft": "none", "compile": "off"}),
    "plain-compiled": ("ours", {"draft": "none", "compile": "on"}),
    "ngram-strict": ("ours", {"draft": "ngram", "draft_topk": 1, "verify": "strict", "compile": "off"}),
    "ngram-strict-compiled": ("ours", {"draft": "ngram", "draft_topk": 1, "verify": "strict", "compile": "on"}),
    "head-strict": ("ours", {"draft": "head", "draft_topk": 1, "verify": "strict", "compile": "off"}),
    "head-strict-compiled": ("ours", {"draft": "head", "draft_topk": 1, "verify": "strict", "compile": "on"}),
    "head-mars-compiled": ("ours", {"draft": "head", "draft_topk": 1, "verify": "mars", "margin": "logit-ratio",
                                    "threshold": 0.9, "compile": "on"}),
    "head-tree-compiled": ("ours", {"draft": "head", "draft_topk": 4, "draft_tokens": 16, "verify": "strict",
                                    "compile": "on"}),
    "head-tree-mars-compiled": ("ours", {"draft": "head", "draft_topk": 4, "draft_tokens": 16, "verify": "mars",
                                         "margin": "logit-ratio", "threshold": 0.9, "compile": "on"}),
    "default-compiled": ("ours", {"draft": "auto", "compile": "on"}),  # what `mars generate` does on CUDA
}


def decode_part(args: argparse.Namespace) -> None:
    from mars_cli.options import DecodingOptions
    from mars_cli.session import Session

    report = Report(args.out, args.budget_s, part="decode", target=args.target, dtype=args.dtype,
                    max_new_tokens=args.new_tokens, num_draft=args.num_draft)
    begin = time.perf_counter()
    target = load_model(args.target, device=args.device, dtype=args.dtype)
    report.add("load_s", round(time.perf_counter() - begin, 1))
    base = DecodingOptions.of(target=args.target, device=args.device, dtype=args.dtype,
                              max_new_tokens=args.new_tokens, num_draft=args.num_draft)
    names = [name for name in args.methods.split(",") if name]
    sessions = {name: Session(base.replace(**DECODE_METHODS[name][1]), target=target)
                for name in names if DECODE_METHODS[name][0] == "ours"}
    prompt_names = args.prompts.split(",")
    encoder = next(iter(sessions.values()))
    prompt_ids = {name: encoder.encode(PROMPTS[name]) for name in prompt_names}

    def run(name: str, prompt: list[int]) -> dict:
        if DECODE_METHODS[name][0] == "hf":
            tokens, seconds = hf_generate(target, prompt, args.new_tokens, exact=False)
            return {"tokens": tokens, "wall_s": seconds}
        result = sessions[name].run(prompt)
        stats = result.stats.summary()
        return {"tokens": result.token_ids, "wall_s": stats["wall_s"], "rounds": stats["rounds"],
                "time_s": stats["time_s"], "per_position_acceptance": stats["per_position_acceptance"],
                "drafted": stats["drafted"]}

    warm_s = {}
    for name in names:  # warm-up: the first prompt; a compiled method every prompt (each graph compiled before timing)
        if not report.time_left(f"warm-up {name}"):
            names = names[:names.index(name)]
            break
        start = time.perf_counter()
        compiled = DECODE_METHODS[name][1].get("compile") == "on"
        for prompt in prompt_names if compiled else prompt_names[:1]:
            run(name, prompt_ids[prompt])
        warm_s[name] = round(time.perf_counter() - start, 1)
        report.add("warm_up_s", warm_s)
    graphs_before = graphs_compiled()

    records: dict[str, dict[str, dict]] = {name: {} for name in names}
    for index, prompt in enumerate(prompt_names):
        if not report.time_left(f"prompt {prompt}"):
            break
        order = names if index % 2 == 0 else list(reversed(names))  # A B / B A
        for name in order:
            records[name][prompt] = run(name, prompt_ids[prompt])
        done = [p for p in prompt_names if p in records[names[0]]]
        report.add("rows", summarise(records, names, done))
        report.add("outputs", {n: {p: records[n][p]["tokens"] for p in done} for n in names})
        report.add("graphs_compiled_while_timed", graphs_compiled() - graphs_before)  # 0: no compile was timed


def graphs_compiled() -> int:
    import torch._dynamo.utils

    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def summarise(records: dict[str, dict[str, dict]], names: list[str], prompts: list[str]) -> list[dict]:
    def tokens_per_s(name: str) -> float:
        runs = [records[name][p] for p in prompts]
        return sum(len(r["tokens"]) for r in runs) / sum(r["wall_s"] for r in runs)

    plain, hf = tokens_per_s("plain"), tokens_per_s("hf-generate")
    greedy = {p: records["hf-generate"][p]["tokens"] for p in prompts}
    rows = []
    for name in names:
        runs = [records[name][p] for p in prompts]
        row = {"method": name, "tokens_per_s": round(tokens_per_s(name), 2),
               "vs_plain": round(tokens_per_s(name) / plain, 3), "vs_hf_generate": round(tokens_per_s(name) / hf, 3),
               "identical_to_hf_greedy": sum(records[name][p]["tokens"] == greedy[p] for p in prompts),
               "prompts": len(prompts)}
        if "rounds" in runs[0]:
            rounds = sum(r["rounds"] for r in runs)
            row["tau"] = round(sum(len(r["tokens"]) for r in runs) / rounds, 3)
            wall = sum(r["wall_s"] for r in runs)
            phases = {k: sum(r["time_s"].get(k, 0.0) for r in runs) for k in runs[0]["time_s"]}
            row["time_share"] = {k: round(v / wall, 3) for k, v in phases.items()}
            drafted = [r for r in runs if r["drafted"]]
            if drafted:
                depth = max(len(r["per_position_acceptance"]) for r in drafted)
                row["per_position_acceptance"] = [
                    round(statistics.mean(r["per_position_acceptance"][i] for r in drafted
                                          if i < len(r["per_position_acceptance"])), 3) for i in range(depth)]
        rows.append(row)
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    widths = lambda text: [int(w) for w in text.split(",") if w]  # noqa: E731
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parts = parser.add_subparsers(dest="part", required=True)
    for name in ("curves", "decode"):
        part = parts.add_parser(name)
        part.add_argument("--device", default="cuda")
        part.add_argument("--dtype", default="bfloat16")
        part.add_argument("--new-tokens", type=int, default=128)
        part.add_argument("--budget-s", type=float, default=420.0, help="start no stage after this many seconds")
        part.add_argument("--out", type=Path, required=True)
    curve = parts.choices["curves"]
    curve.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    curve.add_argument("--eager-widths", type=widths, default=[1, 2, 4, 8, 16, 32])
    curve.add_argument("--compiled-widths", type=widths, default=[1, 5, 8, 16])
    curve.add_argument("--repeats", type=int, default=10)
    curve.add_argument("--prompts", type=int, default=3, help="random prompts for plain decoding")
    curve.add_argument("--prompt-tokens", type=int, default=40)
    curve.add_argument("--hf-static", action="store_true",
                       help="also time transformers' generate with its static cache (it compiles the forward)")
    decoding = parts.choices["decode"]
    decoding.add_argument("--target", default="smollm2-135m")
    decoding.add_argument("--num-draft", type=int, default=4)
    decoding.add_argument("--prompts", default="chat,code,chat2,code2")
    decoding.add_argument("--methods", default=",".join(DECODE_METHODS),
                          help="comma-separated, of: " + ", ".join(DECODE_METHODS) + " (hf-generate and plain needed)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    curves(args) if args.part == "curves" else decode_part(args)


if __name__ == "__main__":
    main()
