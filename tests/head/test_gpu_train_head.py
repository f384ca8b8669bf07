"""benchmarks/tools/gpu_train_head.py's answers bookkeeping: a lent GPU's minutes go to training,
so answers made earlier (on the GPU, or on a CPU) are used instead of made again, and a prompt
file can be answered a second time in the other mode."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mars_cli.head.data import read_generations
from mars_cli.prompts import encode_messages, is_held_out

TOOL = Path(__file__).resolve().parents[2] / "benchmarks" / "tools" / "gpu_train_head.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("gpu_train_head", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_train_head"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules["gpu_train_head"]


def test_a_second_draw_answers_training_prompts_in_the_other_mode(tool):
    first = tool.PromptFile.parse("p.jsonl").answering(64)
    second = tool.PromptFile.parse("dir/p.jsonl@2")
    assert second.label == "p.jsonl@2" and second.draw == 2
    redraw = second.answering(64)
    assert redraw.seed != first.seed
    for index in range(40):
        if is_held_out(index, 10):
            assert not tool.Redraw.select(index) and not redraw.sampled(index)
        else:
            assert tool.Redraw.select(index) and redraw.sampled(index) != first.sampled(index)
    third = tool.PromptFile.parse("p.jsonl@3").answering(64)
    assert all(third.sampled(i) for i in range(40) if not is_held_out(i, 10))


def test_answers_made_earlier_are_put_in_place_when_they_match(tool, tiny_target, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(12)))
    files = [tool.PromptFile(prompts), tool.PromptFile(prompts, 2)]
    first = files[0].answering(16)

    def record(label: str, index: int, mode: str, text: str | None = None) -> dict:
        ids = encode_messages(tiny_target.tokenizer, [{"role": "user", "content": text or f"question {index}"}])
        return {"file": label, "index": index, "mode": mode, "prompt_ids": ids, "output_ids": [5, 6, index]}

    mode = {i: "sampled" if first.sampled(i) else "greedy" for i in range(12)}
    rows = [record("p.jsonl", 0, mode[0]), record("p.jsonl", 1, mode[1]),
            record("p.jsonl", 2, "sampled" if mode[2] == "greedy" else "greedy"),  # another recipe's mode
            record("p.jsonl", 3, mode[3], text="another question"),  # the prompt file changed since
            record("p.jsonl@2", 4, "sampled" if mode[4] == "greedy" else "greedy"),  # the second draw's own
            record("other.jsonl", 0, "greedy")]
    answers = tmp_path / "answers.jsonl.gz"
    with gzip.open(answers, "wt") as stream:
        stream.writelines(json.dumps(row) + "\n" for row in rows)
    folder = tmp_path / "work"
    folder.mkdir()
    counts = tool.seed_answers(tiny_target, files, [answers], folder, 0, 16)
    assert counts == {"seeded": 3, "answer_tokens": 9, "mismatched": 2, "other_files": 1}
    assert sorted(read_generations(folder / "gen-0.jsonl")) == [0, 1]
    assert read_generations(folder / "gen-1.jsonl")[4].output_ids == [5, 6, 4]
    # seeding twice adds nothing: what the resume log holds stays as it is
    again = tool.seed_answers(tiny_target, files, [answers], folder, 0, 16)
    assert again["seeded"] == 0 and len((folder / "gen-0.jsonl").read_text().splitlines()) == 2
