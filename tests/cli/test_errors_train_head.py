"""The error matrix for `mars train-head`: --resume against a checkpoint's recorded options, and a
damaged answers log. Each refusal is exit code 2 and one line on stderr, with no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mars_cli.errors import UserError

from .errors_helpers import MODEL, one_line_error


# train-head --resume: the checkpoint records its options, checked before the target loads
def _checkpoint(path: Path, **changes) -> None:
    import hashlib

    import torch

    from mars_cli.head.data import HEAD_PROMPTS
    from mars_cli.training import HeadRecipe

    options = HeadRecipe().resume_options(hashlib.sha256(HEAD_PROMPTS.read_bytes()).hexdigest())
    options.update(changes)
    torch.save({"step": 3, "head": {}, "optimizer": {}, "losses": [1.0], "options": options}, path)


@pytest.mark.parametrize("flags, recorded, expected", [
    (["--vocab", "100"], {}, "--resume: --vocab differs from the interrupted run (8192 there, 100 now)"),
    (["--lr", "0.01"], {}, "--resume: --lr differs from the interrupted run (0.001 there, 0.01 now)"),
    ([], {"--prompts": "0" * 64}, "--resume: --prompts differs"),
    ([], None, "does not record its options"),
])
def test_train_head_resume_checks_the_recorded_options(capsys, tmp_path, tiny_dir, no_model, flags, recorded,
                                                       expected):
    import torch

    head = tmp_path / "head"
    checkpoint = tmp_path / "head.ckpt"
    if recorded is None:  # made by an older mars
        torch.save({"step": 3, "head": {}, "optimizer": {}, "losses": [1.0]}, checkpoint)
    else:
        _checkpoint(checkpoint, **recorded)
    one_line_error(capsys, ["train-head", "--target", str(tiny_dir), "--out", str(head), "--resume", *flags, *MODEL],
                   expected)
    assert checkpoint.is_file()  # nothing already written is lost


def test_train_head_resume_without_a_checkpoint_is_refused(capsys, tmp_path, tiny_dir, no_model):
    head = tmp_path / "head"
    one_line_error(capsys, ["train-head", "--target", str(tiny_dir), "--out", str(head), "--resume", *MODEL],
                   f"nothing to resume: there is no checkpoint {tmp_path / 'head.ckpt'}")
    (tmp_path / "head.ckpt").write_bytes(b"not a checkpoint")
    one_line_error(capsys, ["train-head", "--target", str(tiny_dir), "--out", str(head), "--resume", *MODEL],
                   "cannot read the checkpoint")


def test_head_data_log_with_bytes_that_are_not_utf8_or_a_fifo(tmp_path):
    """train-head's resume log of generated answers: damaged lines are generated again; a FIFO
    in its place is one sentence, not a hang."""
    import os

    from mars_cli.head.data import read_generations

    log = tmp_path / "generations.jsonl"
    good = {"index": 1, "mode": "greedy", "prompt_ids": [1, 2], "output_ids": [3]}
    log.write_bytes(b'{"index": 0, "prompt_ids": [1], "outp\xff\xfe\n' + json.dumps(good).encode() + b"\n[1]\n")
    assert list(read_generations(log)) == [1]
    log.unlink()
    os.mkfifo(log)
    with pytest.raises(UserError, match="is not a regular file"):
        read_generations(log)
