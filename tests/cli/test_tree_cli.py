"""Tree flags on the command line: bad values are one line, and generate reports the tree it drafted."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("args, message", [
    (["--draft-topk", "0"], "--draft-topk must be 'auto' or between 1 and 16"),
    (["--draft-topk", "17"], "--draft-topk must be 'auto' or between 1 and 16"),
    (["--draft-topk", "wide"], "--draft-topk must be 'auto' or between 1 and 16"),
    (["--draft-tokens", "0"], "--draft-tokens must be 'auto' or between 1 and 64"),
    (["--draft-tokens", "65"], "--draft-tokens must be 'auto' or between 1 and 64"),
])
def test_bad_tree_flags_are_one_line(capsys, tiny_dir, args, message):
    from mars_cli.cli import main

    code = main(["generate", "hello", "--target", str(tiny_dir), "--device", "cpu", "--draft", "ngram", "-n", "4", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_tree_wider_than_the_context_window_is_one_line(capsys, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from mars_cli.cli import main

    from ..conftest import build_tokenizer

    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    capsys.readouterr()  # transformers' own progress bar while saving
    code = main(["generate", "hi", "--target", str(tmp_path), "--device", "cpu", "--draft", "ngram", "-n", "4",
                 "--raw", "--draft-topk", "4", "--draft-tokens", "48"])
    err = capsys.readouterr().err
    assert code == 2 and "--draft-tokens 48" in err and "context" in err
    assert len([line for line in err.strip().splitlines() if not line.startswith("mars: note")]) == 1


def test_generate_shows_the_tree_it_drafted(capsys, tiny_dir):
    import json

    from mars_cli.cli import main

    code = main(["generate", "abcabcabcabc", "--target", str(tiny_dir), "--device", "cpu", "--draft", "ngram",
                 "--raw", "-n", "12", "--num-draft", "3", "--draft-topk", "3", "--draft-tokens", "6", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["config"]["tree_topk"] == 3 and report["config"]["tree_tokens"] == 6
    assert report["stats"]["accepted_length_histogram"]




def test_a_head_tree_gets_no_note_that_nothing_is_proposed(capsys, tiny_dir, tiny_target, tmp_path):
    """`--draft head --draft-topk 4` drafts a top-4 tree: the 'proposes nothing' note belongs to
    `--draft none` alone."""
    from mars_cli.cli import main

    from ..head.test_eagle3 import write_public_head

    write_public_head(tmp_path / "head", tiny_target)
    base = ["generate", "abcabc", "--target", str(tiny_dir), "--device", "cpu", "--raw", "-n", "4",
            "--draft-topk", "4", "--draft-tokens", "8"]
    assert main([*base, "--draft", f"head:{tmp_path / 'head'}"]) == 0
    assert "proposes nothing" not in capsys.readouterr().err
    assert main([*base, "--draft", "none"]) == 0
    assert "--draft none proposes nothing; --draft-topk 4 is ignored" in capsys.readouterr().err
