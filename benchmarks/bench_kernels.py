"""The linear kernels torch offers on this CPU, timed on a model's real linear shapes: one forward
of M rows through every linear (the layers and the output layer), each kernel's weights made once
from the same random float32 weights, kernels interleaved round by round, the median counting.

    python benchmarks/bench_kernels.py [--target smollm2-135m] [--widths 1,2,5,9,17,33] [--repeats 7] [--out F]

What it answers: which kernel a plain step (M=1) and a tree verification (M=9-17) should use
(docs/benchmarks.md, "Kernels"). The weights are random: a kernel's time does not depend on them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mars_cli.decoding import quantized  # noqa: E402
from mars_cli.errors import KERNEL_FAILURES  # noqa: E402
from mars_cli.tuning.machine import cpu_name  # noqa: E402


def linear_shapes(target: str) -> list[tuple[int, int]]:
    """(out_features, in_features) of every linear a forward runs, the output layer included."""
    from transformers import AutoConfig

    from mars_cli.models.gguf_cache import gguf_cache_entry
    from mars_cli.models.loading import resolve_spec

    location, gguf_name = resolve_spec(target)
    config = AutoConfig.from_pretrained(gguf_cache_entry(location) if gguf_name else location)
    hidden, inner = config.hidden_size, config.intermediate_size
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    layer = [(heads * head_dim, hidden), (kv_heads * head_dim, hidden), (kv_heads * head_dim, hidden),
             (hidden, heads * head_dim), (inner, hidden), (inner, hidden), (hidden, inner)]
    return layer * config.num_hidden_layers + [(config.vocab_size, hidden)]


def kernels(shapes: list[tuple[int, int]]) -> dict[str, list]:
    """Each kernel's per-linear callables, built from one set of seeded float32 weights."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=generator) * k ** -0.5 for n, k in shapes]
    made: dict[str, list] = {
        "float32 dense": [lambda x, w=w: F.linear(x, w) for w in weights],
        "bfloat16 dense": [lambda x, w=w.bfloat16(): F.linear(x.bfloat16(), w) for w in weights],
    }
    try:
        made["q4: torch's int4 kernel (group 32)"] = [quantized.QuantizedLinear.from_weight(w, None, "torch")
                                                      for w in weights]
        made["int8 weights (per channel)"] = [int8_weights(w) for w in weights]
        made["int8 x int8 (activations per row)"] = [int8_dynamic(w) for w in weights]
    except (*KERNEL_FAILURES, AttributeError) as exc:  # this torch or CPU lacks a kernel
        print(f"a quantized kernel is not available: {exc}", file=sys.stderr)
    from mars_cli.decoding import kernels

    why = kernels.problem()
    if why is None:
        made["q4: this project's kernel (AVX2)"] = [quantized.QuantizedLinear.from_weight(w, None, "mars")
                                                   for w in weights]
        a8 = [quantized.QuantizedLinear.from_weight(w, None, "mars") for w in weights]
        for layer in a8:
            layer.matrices[0].activations = 8
        made["q4a8: this project's kernel, 8-bit activations (AVX2)"] = a8
    else:
        print(f"q4: {why}", file=sys.stderr)
    return made


def int8_weights(weight: torch.Tensor):
    """int8 weights, one scale a row (`aten._weight_int8pack_mm`), float32 activations."""
    scale = weight.abs().amax(1).clamp_min(1e-12) / 127
    codes = (weight / scale[:, None]).round().to(torch.int8)
    return lambda x: torch.ops.aten._weight_int8pack_mm(x, codes, scale)


def int8_dynamic(weight: torch.Tensor):
    """int8 weights and int8 activations quantized per row at run time (`torch._int_mm`)."""
    scale = weight.abs().amax(1).clamp_min(1e-12) / 127
    codes = (weight / scale[:, None]).round().to(torch.int8).t().contiguous()

    def product(x: torch.Tensor) -> torch.Tensor:
        row_scale = x.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
        rows = (x / row_scale).round().to(torch.int8)
        return torch._int_mm(rows, codes).float() * row_scale * scale

    return product


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--widths", default="1,2,5,9,17,33")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--kernels", help="only the kernels whose names contain one of these (comma-separated)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    shapes = linear_shapes(args.target)
    made = kernels(shapes)
    if args.kernels:
        made = {name: layers for name, layers in made.items() if any(part in name for part in args.kernels.split(","))}
    hidden_in = {k for _, k in shapes}
    inputs = {(m, k): torch.randn(m, k) for m in widths for k in hidden_in}
    times: dict[str, dict[int, list[float]]] = {name: {m: [] for m in widths} for name in made}
    with torch.inference_mode():
        for _ in range(args.repeats + 1):  # the first round warms up and is dropped below
            for m in widths:
                for name, layers in made.items():
                    start = time.perf_counter()
                    for layer, (_, k) in zip(layers, shapes):
                        layer(inputs[(m, k)])
                    times[name][m].append((time.perf_counter() - start) * 1000)
    table = {name: {m: statistics.median(samples[1:]) for m, samples in by_width.items()}
             for name, by_width in times.items()}
    print(f"linears of {args.target}: {len(shapes)} layers, {sum(n * k for n, k in shapes) / 1e6:.1f}M weights; "
          f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| kernel | " + " | ".join(f"M={m}" for m in widths) + " |")
    print("|---|" + "---|" * len(widths))
    for name, by_width in table.items():
        print(f"| {name} | " + " | ".join(f"{by_width[m]:.1f}" for m in widths) + " |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"target": args.target, "cpu": cpu_name(), "torch": torch.__version__,
                                        "threads": torch.get_num_threads(), "ms": table}, indent=1))


if __name__ == "__main__":
    main()
