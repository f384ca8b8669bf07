"""The README's pair, meta-llama/Llama-3.1-8B-Instruct with yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
(the pair vLLM's EAGLE-3 docs use), against our loader with the published numbers: the head's
config.json exactly as published (its keys and values, as SafeAILab/EAGLE's
eagle/traineagle3/config.json and SpecForge's configs/llama3-8B-eagle3.json carry them; the hub
was not reachable here), and a weights file whose header declares the real shapes (a sparse
file: 0.85 GB of fp16 weights that take no disk and are never read). Everything our loader checks
before it allocates a head runs on them: the config field by field, the sizes against the
target, the tensors' names, shapes and dtypes, the target's widths and vocabulary, the RoPE
settings and the feature layers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mars_cli.errors import UserError
from mars_cli.head import validate
from mars_cli.head.drafter import _check_eagle3
from mars_cli.head.eagle3 import Eagle3Config, Eagle3Head, default_aux_layers, rope_frequencies

# yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's config.json, key for key
PUBLISHED_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 1,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.28.1",
    "use_cache": True,
    "vocab_size": 128256,
    "draft_vocab_size": 32000,
}
# meta-llama/Llama-3.1-8B-Instruct: what the loader reads of its target
TARGET_SPEC, TARGET_HIDDEN, TARGET_VOCAB, TARGET_LAYERS = "meta-llama/Llama-3.1-8B-Instruct", 4096, 128256, 32
TARGET_PARAMETERS = 8_030_261_248
HEAD_WEIGHTS = 424_689_664  # fc, the layer, the norms and lm_head: 0.85 GB in fp16, 1.7 GB in float32
BYTES = {"F16": 2, "I64": 8, "BOOL": 1}


def write_sparse_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """A safetensors file whose header declares `tensors` (name: dtype, shape), its data a hole."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as stream:
        stream.write(len(raw).to_bytes(8, "little") + raw)
        stream.truncate(8 + len(raw) + offset)


def published_head(directory: Path, *, with_embeddings: bool = False) -> Path:
    """The head directory as published: config.json and the weights' names, shapes and dtypes."""
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(PUBLISHED_CONFIG, indent=2))
    shapes = Eagle3Config.from_json(PUBLISHED_CONFIG, "config.json").tensor_shapes()
    tensors = {name: ("I64" if name == "d2t" else "BOOL" if name == "t2d" else "F16", shape)
               for name, shape in shapes.items()}
    if with_embeddings:  # a copy of the target's embeddings some checkpoints carry: ignored
        tensors["embed_tokens.weight"] = ("F16", (TARGET_VOCAB, TARGET_HIDDEN))
    write_sparse_safetensors(directory / "model.safetensors", tensors)
    return directory


def target(vocab: int = TARGET_VOCAB, hidden: int = TARGET_HIDDEN) -> SimpleNamespace:
    """What the checks read of a loaded target, its embeddings on the meta device (no memory)."""
    embeddings = torch.nn.Embedding(vocab, hidden, device="meta")
    return SimpleNamespace(model=SimpleNamespace(get_input_embeddings=lambda: embeddings), vocab_size=vocab,
                           spec=TARGET_SPEC, fingerprint="0" * 64, num_layers=TARGET_LAYERS)


class Checked(Exception):
    """Raised where the loader would read the tensors: everything before it accepted the head."""


def load_until_the_tensors(directory: Path, against: SimpleNamespace) -> tuple[Eagle3Config, int]:
    seen = {}

    def check(config: Eagle3Config, width: int) -> None:
        _check_eagle3(config, width, directory, against)  # the drafter's checks against the target
        seen.update(config=config, width=width)
        raise Checked

    limit = min(validate.MAX_HEAD_PARAMETERS, validate.TARGET_FACTOR * TARGET_PARAMETERS)  # memory aside
    with pytest.raises(Checked):
        Eagle3Head.load(directory, check=check, max_parameters=limit)
    return seen["config"], seen["width"]


def test_the_published_config_parses_with_the_numbers_vllm_reads():
    config = Eagle3Config.from_json(PUBLISHED_CONFIG, "config.json")
    assert (config.hidden_size, config.intermediate_size) == (4096, 14336)
    assert (config.num_attention_heads, config.num_key_value_heads, config.attention_head_dim) == (32, 8, 128)
    assert (config.vocab_size, config.draft_vocab_size) == (128256, 32000)
    assert config.rms_norm_eps == 1e-05 and config.rope_theta == 10000.0  # no rope_theta: 10000, as vLLM reads it
    assert config.rope_scaling is None and config.target_hidden_size is None and config.aux_layer_ids is None
    assert config.extra["architectures"] == ["LlamaForCausalLMEagle3"] and config.extra["torch_dtype"] == "float16"
    shapes = config.tensor_shapes()
    assert shapes["fc.weight"] == (4096, 3 * 4096) and shapes["lm_head.weight"] == (32000, 4096)
    assert shapes["midlayer.self_attn.q_proj.weight"] == (4096, 8192)  # reads cat(embedding, state): 2h
    assert shapes["d2t"] == (32000,) and shapes["t2d"] == (128256,)
    assert sum(math.prod(s) for name, s in shapes.items() if name not in ("d2t", "t2d")) == HEAD_WEIGHTS
    inverse, scale = rope_frequencies(config)
    assert inverse.shape == (64,) and scale == 1.0
    assert default_aux_layers(TARGET_LAYERS) == (2, 16, 29)  # no eagle_config: low, middle and high of 32


@pytest.mark.parametrize("with_embeddings", [False, True])
def test_the_published_head_passes_every_check_before_allocation(tmp_path, with_embeddings):
    directory = published_head(tmp_path / "eagle3", with_embeddings=with_embeddings)
    config, width = load_until_the_tensors(directory, target())
    assert width == TARGET_HIDDEN and config.draft_vocab_size == 32000


def test_the_published_head_is_refused_for_another_target(tmp_path):
    """The checks are live: the same files against a target of another vocabulary and width."""
    directory = published_head(tmp_path / "eagle3")
    with pytest.raises(UserError, match="vocabulary 128256, the target's is 151936") as refused:
        load_until_the_tensors(directory, target(vocab=151936, hidden=5120))
    assert "fc reads 12288 features, the target gives 3 x 5120" in str(refused.value)
