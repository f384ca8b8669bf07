"""`--dtype q4` end to end: lossless within its precision (strict verification reproduces q4's own
plain greedy decoding, chains and trees), and on the embedded GGUF, whose codes are used exactly,
the same tokens as float32."""

from __future__ import annotations

import json

import pytest

from mars_cli.decoding import kernels
from tests.cli.test_cli import run_cli

pytestmark = pytest.mark.skipif(kernels.problem() is not None, reason=f"no q4 kernel here: {kernels.problem()}")


def tokens(capsys, *args: str) -> tuple[list[int], dict]:
    code, out, err = run_cli(capsys, "generate", *args, "--json", "--device", "cpu")
    assert code == 0, err
    payload = json.loads(out)
    return payload["token_ids"], payload


@pytest.mark.parametrize("mode", ["q4", "q4a8"])
@pytest.mark.parametrize("shape", [("--draft-topk", "1"), ("--draft-topk", "3", "--draft-tokens", "8")])
def test_strict_verification_in_a_quantized_mode_reproduces_its_plain_greedy(capsys, tiny_dir, cache, shape, mode):
    prompt = "abc abc abc ab"
    plain, payload = tokens(capsys, prompt, "--target", str(tiny_dir), "--dtype", mode, "--draft", "none",
                            "-n", "24")
    assert payload["config"]["dtype"] == mode
    assert payload["tuning"]["packed_weights"]["problem"] == f"--dtype {mode} runs the linears on their codes"
    drafted, payload = tokens(capsys, prompt, "--target", str(tiny_dir), "--dtype", mode, "--draft", "ngram",
                              "--verify", "strict", "--num-draft", "4", *shape, "-n", "24")
    assert drafted == plain and payload["stats"]["drafted"] > 0


def test_q4_of_float_weights_says_it_is_lossy(capsys, tiny_dir, cache):
    code, _, err = run_cli(capsys, "generate", "abc", "--target", str(tiny_dir), "--device", "cpu", "--dtype", "q4",
                           "--draft", "none", "-n", "4")
    assert code == 0 and "quantized to 4 bits now (lossy" in err


@pytest.mark.parametrize("flags, message", [(("--dtype", "q5"), "expected auto, float32, bfloat16, float16, q4 or q4a8"),
                                            (("--dtype", "q4", "--packed-weights", "on"), "runs the linears on their codes")])
def test_bad_q4_requests_get_one_line(capsys, tiny_dir, cache, flags, message):
    code, out, err = run_cli(capsys, "generate", "abc", "--target", str(tiny_dir), "--device", "cpu", *flags, "-n", "4")
    assert code == 2 and out == "" and message in err and "Traceback" not in err


@pytest.mark.embedded
def test_q4_of_the_embedded_gguf_decodes_as_float32_does(capsys):
    """The Q4_1 file's own codes (and its Q8_0 output layer's): q4 is float32 from a quarter of the bytes."""
    for prompt in ("Write a haiku about the sea.", "What is 12 times 7?"):
        exact, _ = tokens(capsys, prompt, "--dtype", "float32", "--draft", "none", "-n", "24")
        fast, payload = tokens(capsys, prompt, "--dtype", "q4", "--draft", "none", "-n", "24")
        assert fast == exact and payload["config"]["dtype"] == "q4"
    _, payload = tokens(capsys, "Name three colors.", "--dtype", "q4", "-n", "16", "--verify", "strict",
                        "--num-draft", "4", "--draft-topk", "1")  # fixed: drafting whatever this machine's curve says
    assert payload["config"]["dtype"] == "q4" and payload["stats"]["drafted"] > 0
    code, _, err = run_cli(capsys, "generate", "Hi", "--dtype", "q4", "-n", "2", "--device", "cpu")
    assert code == 0 and "preparing the q4 linears" not in err and "lossy" not in err  # read from the cache entry


def test_a_head_under_q4_drafts_on_8_bit_codes_and_strict_greedy_stays_exact(tiny_dir):
    """The head's float weights quantized afresh to 8 bits (its drafts move, its output may not):
    strict greedy verification still gives q4's own greedy tokens, chains and trees."""
    import random

    import torch

    from mars_cli.decoding import quantized
    from mars_cli.decoding.sampling import SamplingParams
    from mars_cli.decoding.tree import TreeShape
    from mars_cli.decoding.verifiers import Verifier
    from mars_cli.errors import UserError
    from mars_cli.head.drafter import HeadDrafter
    from mars_cli.models import load_model
    from mars_cli.tuning import int8
    from tests.decoding.test_loop import hf_greedy, random_prompt
    from tests.head.test_int8_head import bf16_head
    from tests.trees import decode_all

    target = load_model(str(tiny_dir), device="cpu", dtype="float32")
    quantized.quantize_target(target)
    prompt = random_prompt(random.Random(3), len(target.tokenizer), 15)
    expected = hf_greedy(target, prompt, 30)  # q4's own greedy decoding
    head = bf16_head(target, 0).float().attach(target.model)
    choice = int8.settle(head, target, "auto")
    assert not choice.used and choice.problem == "--dtype q4: the head's linears run on 8-bit codes"
    forwards = [m.__dict__.get("forward") for m in head.modules() if isinstance(m, torch.nn.Linear)]
    assert any(isinstance(f, quantized.QuantizedLinear) and f.levels == 256 for f in forwards)
    for shape in (TreeShape(1, 4), TreeShape(4, 12)):
        drafter = HeadDrafter(head, target, SamplingParams(0.0), shape=shape)
        assert decode_all(target, drafter, prompt, 30, Verifier("strict"), 4, shape.tokens) == expected
    with pytest.raises(UserError, match="8-bit codes"):
        int8.settle(head, target, "on")


@pytest.mark.embedded
@pytest.mark.parametrize("shape", [("--draft-topk", "1"), ("--draft-topk", "2", "--draft-tokens", "6")])
def test_q4a8_strict_verification_with_the_head_reproduces_q4a8_plain_on_the_embedded_model(capsys, shape):
    """8-bit activations amplify any width-dependent rounding into other tokens: this holds only
    because every row is computed bit for bit alike however it is fed (tests/decoding/test_lean.py)."""
    for prompt in ("Write a haiku about the sea.", "Name three colors and explain why you like them."):
        plain, _ = tokens(capsys, prompt, "--dtype", "q4a8", "--draft", "none", "-n", "32")
        drafted, payload = tokens(capsys, prompt, "--dtype", "q4a8", "--verify", "strict", "--num-draft", "3",
                                  *shape, "-n", "32")
        assert drafted == plain and payload["stats"]["drafted"] > 0 and payload["config"]["dtype"] == "q4a8"
