"""EAGLE-3 heads: the public checkpoint format (written here key by key, independently of our
writer), cached drafting against recomputation, losslessness whatever the weights, the training
unroll, our own round trip, and every way a head directory can be wrong."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mars_cli.decoding.sampling import SamplingParams
from mars_cli.errors import UserError
from mars_cli.head.drafter import HeadDrafter, load_head
from mars_cli.head.eagle3 import Eagle3Head, default_aux_layers
from mars_cli.head.model import HeadCache

from .test_head import assert_unroll_matches_drafting
from ..decoding.test_loop import hf_greedy, random_prompt, run

PUBLIC_KEYS = {
    "fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight", "norm.weight", "lm_head.weight",
    "d2t", "t2d",
}


def target_shape(target) -> tuple[int, int]:
    return target.model.get_input_embeddings().weight.shape[1], target.model.get_output_embeddings().weight.shape[0]


def write_public_head(directory: Path, target, seed: int = 0, draft_vocab: int | None = None, heads: int = 4,
                      kv_heads: int = 2, drop: str | None = None, add: str | None = None,
                      config_changes: dict | None = None, fc_width: int | None = None) -> Path:
    """A randomly initialised EAGLE-3 checkpoint as the public ones are laid out: config.json
    (no rope_theta) and model.safetensors with exactly the public key names, a non-trivial d2t."""
    hidden, vocab = target_shape(target)
    generator = torch.Generator().manual_seed(seed)
    draft_vocab = draft_vocab or vocab - 7
    ids = torch.sort(torch.randperm(vocab, generator=generator)[:draft_vocab]).values
    d, inner = hidden // heads, 2 * hidden

    def weight(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.3).to(torch.float16)

    tensors = {
        "fc.weight": weight(hidden, fc_width or 3 * hidden),
        "midlayer.self_attn.q_proj.weight": weight(heads * d, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": weight(kv_heads * d, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": weight(kv_heads * d, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": weight(hidden, heads * d),
        "midlayer.mlp.gate_proj.weight": weight(inner, hidden),
        "midlayer.mlp.up_proj.weight": weight(inner, hidden),
        "midlayer.mlp.down_proj.weight": weight(hidden, inner),
        "midlayer.input_layernorm.weight": 1 + weight(hidden),
        "midlayer.hidden_norm.weight": 1 + weight(hidden),
        "midlayer.post_attention_layernorm.weight": 1 + weight(hidden),
        "norm.weight": 1 + weight(hidden),
        "lm_head.weight": weight(draft_vocab, hidden),
        "d2t": ids - torch.arange(draft_vocab),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True),
        "embed_tokens.weight": weight(vocab, hidden),  # some checkpoints carry it: ignored
    }
    if drop:
        tensors.pop(drop)
    if add:
        tensors[add] = weight(3)
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inner, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": draft_vocab,
              "rms_norm_eps": 1e-6, "hidden_act": "silu", "max_position_embeddings": 2048, "torch_dtype": "float16"}
    config.update(config_changes or {})
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def aux_features(target, ids: list[int], head: Eagle3Head) -> torch.Tensor:
    with torch.no_grad():
        out = target.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in head.feature_layers_for(target.model)], dim=-1)[0]


def test_public_checkpoint_loads_with_every_key(tiny_target, tmp_path):
    directory = write_public_head(tmp_path / "head", tiny_target)
    head = load_head(f"head:{directory}", tiny_target)
    stored = {k for k in head.state_dict()}
    assert stored == PUBLIC_KEYS
    from safetensors.torch import load_file

    tensors = load_file(str(directory / "model.safetensors"))
    for name in PUBLIC_KEYS:
        assert torch.equal(head.state_dict()[name].to(tensors[name].dtype), tensors[name]), name
    # draft row i is target token i + d2t[i]; t2d marks exactly those
    assert torch.equal(head.vocab_ids, torch.arange(tensors["d2t"].numel()) + tensors["d2t"])
    assert torch.equal(head.t2d, tensors["t2d"])
    # no rope_theta: 10000, the head's own default (not the target's)
    d = head.head_dim
    assert head.inv_freq[1].item() == pytest.approx(10000 ** (-2 / d), rel=1e-6)
    layers = tiny_target.model.config.num_hidden_layers
    assert head.feature_layers_for(tiny_target.model) == default_aux_layers(layers)


def test_configured_aux_layers_are_read_one_past(tiny_target, tmp_path):
    directory = write_public_head(tmp_path / "head", tiny_target,
                                  config_changes={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 1]},
                                                  "rope_theta": 500000.0})
    head = load_head(f"head:{directory}", tiny_target)
    assert head.feature_layers_for(tiny_target.model) == (1, 2, 2)
    assert head.inv_freq[1].item() == pytest.approx(500000 ** (-2 / head.head_dim), rel=1e-6)


def test_cached_drafting_equals_recomputation(tiny_target, tmp_path):
    """What the drafter proposes with its cache (rolled back and reused across rounds) equals a
    from-scratch recomputation of every pair, true and fed back, at every drafting step."""
    head = load_head(f"head:{write_public_head(tmp_path / 'head', tiny_target, seed=3)}", tiny_target)
    drafter = HeadDrafter(head, tiny_target, SamplingParams(0.0))
    ids = random_prompt(random.Random(5), len(tiny_target.tokenizer), 12)
    features = aux_features(tiny_target, ids, head)
    for cut in (6, 9, 12):  # three rounds, each after more true positions
        drafter.observe_features(features[drafter.known : cut - 1])
        proposed = drafter.propose(torch.tensor(ids[:cut]), 4).tokens.tolist()
        true_features, true_tokens = features[: cut - 1], torch.tensor(ids[1:cut])
        fed_states: list[torch.Tensor] = []
        fed_tokens: list[int] = []
        recomputed: list[int] = []
        with torch.no_grad():
            for _ in range(4):
                cache = HeadCache()  # nothing reused: every pair read again
                state = head.step(true_features, true_tokens, cache)[-1:]
                for fed, token in zip(fed_states, fed_tokens):
                    state = head.step(fed, torch.tensor([token]), cache)
                token = int(head.vocab_ids[head.logits(state[0]).argmax()])
                recomputed.append(token)
                fed_states.append(state)
                fed_tokens.append(token)
        assert proposed == recomputed


@pytest.mark.parametrize("seed", range(4))
def test_strict_greedy_with_a_public_head_reproduces_the_target(tiny_target, tmp_path, seed):
    rng = random.Random(seed)
    prompt = random_prompt(rng, len(tiny_target.tokenizer), rng.randint(1, 10))
    max_new = rng.randint(8, 30)
    expected = hf_greedy(tiny_target, prompt, max_new)
    head = load_head(f"head:{write_public_head(tmp_path / 'head', tiny_target, seed=seed)}", tiny_target)
    for k in (1, 3, 5):
        assert run(tiny_target, HeadDrafter(head, tiny_target, SamplingParams(0.0)), prompt, max_new, k) == expected


def test_unroll_equals_incremental_drafting(tiny_target, tmp_path):
    """Training-time test: pass d at pair i is exactly draft step d after true pairs up to i-d+1."""
    head = load_head(f"head:{write_public_head(tmp_path / 'head', tiny_target, seed=1)}", tiny_target)
    ids = random_prompt(random.Random(2), len(tiny_target.tokenizer), 13)
    assert_unroll_matches_drafting(head, aux_features(tiny_target, ids, head), torch.tensor(ids), depth=3)


def test_our_writer_round_trips_to_identical_drafts(tiny_target, tmp_path):
    head = load_head(f"head:{write_public_head(tmp_path / 'public', tiny_target, seed=4)}", tiny_target)
    head.config.mars = {"target": tiny_target.spec, "target_fingerprint": tiny_target.fingerprint}
    head.save_pretrained(tmp_path / "ours")
    from safetensors.torch import load_file

    assert set(load_file(str(tmp_path / "ours" / "model.safetensors"))) == PUBLIC_KEYS
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == head.config.draft_vocab_size
    again = load_head(f"head:{tmp_path / 'ours'}", tiny_target)
    prompt = random_prompt(random.Random(9), len(tiny_target.tokenizer), 10)
    for h in (head, again):
        h.eval()
    first = HeadDrafter(head, tiny_target, SamplingParams(0.0))
    second = HeadDrafter(again, tiny_target, SamplingParams(0.0))
    for drafter in (first, second):
        drafter.observe_features(aux_features(tiny_target, prompt[:-1], head))
    assert first.propose(torch.tensor(prompt), 5).tokens.tolist() == second.propose(torch.tensor(prompt), 5).tokens.tolist()


@pytest.mark.parametrize("change, message", [
    (dict(drop="midlayer.hidden_norm.weight"), "missing midlayer.hidden_norm.weight"),
    (dict(add="midlayer.extra.weight"), "unexpected midlayer.extra.weight"),
    (dict(config_changes={"hidden_size": 48}), "has shape"),
    (dict(config_changes={"num_hidden_layers": 2}), "one decoder layer"),
    (dict(fc_width=20), "fc.weight"),
    (dict(config_changes={"draft_vocab_size": "many"}), "draft_vocab_size"),
])
def test_malformed_head_directories_are_one_line(tiny_target, tmp_path, change, message):
    directory = write_public_head(tmp_path / "head", tiny_target, **change)
    with pytest.raises(UserError, match=message.replace(".", r"\.")):
        load_head(f"head:{directory}", tiny_target)


def test_d2t_outside_the_target_vocabulary_is_refused(tiny_target, tmp_path):
    directory = write_public_head(tmp_path / "head", tiny_target)
    from safetensors.torch import load_file

    tensors = load_file(str(directory / "model.safetensors"))
    tensors["d2t"][-1] += 10_000
    save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(UserError, match="outside the target vocabulary"):
        load_head(f"head:{directory}", tiny_target)


def test_head_for_another_target_is_refused(tiny_target, tiny_draft, tmp_path):
    directory = write_public_head(tmp_path / "head", tiny_target)
    config = json.loads((directory / "config.json").read_text())
    config["mars"] = {"target": "elsewhere", "target_fingerprint": "0" * 64}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="fingerprint"):
        load_head(f"head:{directory}", tiny_target)
    other = write_public_head(tmp_path / "wide", tiny_target, config_changes={"vocab_size": 999})
    with pytest.raises(UserError):
        load_head(f"head:{other}", tiny_target)


def test_a_pickled_head_needs_allow_pickle(tiny_target, tmp_path):
    directory = write_public_head(tmp_path / "head", tiny_target)
    from safetensors.torch import load_file

    torch.save(load_file(str(directory / "model.safetensors")), directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()
    with pytest.raises(UserError, match="--allow-pickle"):
        load_head(f"head:{directory}", tiny_target)
    assert load_head(f"head:{directory}", tiny_target, allow_pickle=True).config.draft_vocab_size > 0


def test_cli_generate_with_a_broken_head_directory_is_one_line(capsys, tiny_dir, tmp_path, tiny_target):
    from ..cli.test_cli import run_cli

    directory = write_public_head(tmp_path / "head", tiny_target, drop="norm.weight")
    code, _, err = run_cli(capsys, "generate", "hello", "--target", str(tiny_dir), "--device", "cpu",
                           "--draft", f"head:{directory}", "-n", "4")
    assert code == 2 and "missing norm.weight" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_head_drafts_in_the_session_dtype(tiny_dir, tiny_target, tmp_path):
    """A bfloat16 session gets a bfloat16 head (weights, kept features, its cache): no float32
    matmuls nor casts beside a bfloat16 target. Its sampling q stays float32 and sums to 1; a
    float32 session keeps a float32 head."""
    from mars_cli.models import load_model

    directory = write_public_head(tmp_path / "head", tiny_target, seed=2)
    assert {p.dtype for p in load_head(f"head:{directory}", tiny_target).parameters()} == {torch.float32}
    target = load_model(str(tiny_dir), device="cpu", dtype="bfloat16")
    head = load_head(f"head:{directory}", target)
    assert {p.dtype for p in head.parameters()} == {torch.bfloat16}
    ids = random_prompt(random.Random(7), len(target.tokenizer), 10)
    features = aux_features(target, ids, head)
    for sampling in (SamplingParams(0.0), SamplingParams(1.0)):
        drafter = HeadDrafter(head, target, sampling)
        drafter.observe_features(features[:-1])
        tree = drafter.propose(torch.tensor(ids), 4)
        assert drafter.features.dtype == torch.bfloat16 and drafter.cache.keys.dtype == torch.bfloat16
        assert tree.tokens.numel() == 4 and all(0 <= t < len(target.tokenizer) for t in tree.tokens.tolist())
    output = run(target, HeadDrafter(head, target, SamplingParams(0.0)), ids, 12, 3)
    assert len(output) == 12
