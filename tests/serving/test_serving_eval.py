"""`mars eval --engine vllm` without vLLM: its refusals, and how vLLM's per-request outputs become
our sample records (acceptance from vLLM's per-request histogram, a batch's wall time and MARS
counts shared so that sums over samples are the batch's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mars_cli.cli import main
from mars_cli.evaluation.aggregate import method_row
from mars_cli.evaluation.suites import Sample
from mars_cli.serving.evaluation import _add_turn, _empty_record, _share


def completion(tokens: list[int], histogram: list[int] | None, drafted: int = 0):
    metrics = None if histogram is None else SimpleNamespace(histogram=histogram, num_draft_tokens=drafted)
    logprobs = [{token: SimpleNamespace(logprob=-0.5)} for token in tokens]
    return SimpleNamespace(text="x" * len(tokens), token_ids=tokens, logprobs=logprobs, spec_decode_metrics=metrics)


def sample(name: str) -> Sample:
    return Sample(id=name, turns=["hi"], reference={})


def test_vllm_histograms_become_rounds_acceptance_and_positions():
    record = _empty_record(sample("a"))
    # 4 rounds of k = 3: accepted 0, 1, 3, 3 drafts (emitting 1 + 2 + 4 + 4 = 11), plus 2 steps without a draft
    _add_turn(record, completion(list(range(13)), [1, 1, 0, 2], drafted=12), ())
    assert (record["rounds"], record["accepted"], record["drafted"], record["new_tokens"]) == (6, 7, 12, 13)
    assert record["accepted_per_round"] == {"0": 1, "1": 1, "2": 0, "3": 2}
    assert record["drafted_at"] == [4, 4, 4] and record["accepted_at"] == [3, 2, 2]
    assert record["sum_logprob"] == pytest.approx(-6.5)
    vanilla = _empty_record(sample("a"))
    _add_turn(vanilla, completion([1, 2, 3], None), ())
    assert (vanilla["rounds"], vanilla["drafted"]) == (3, 0)


def test_a_batch_shares_its_wall_by_tokens_and_mars_counts_by_acceptance():
    records = [_empty_record(sample(name)) for name in "abc"]
    for record, tokens, histogram in zip(records, (10, 30, 20), ([5, 0, 0, 0], [2, 2, 2, 2], [3, 1, 1, 0])):
        _add_turn(record, completion(list(range(tokens)), histogram, drafted=3 * sum(histogram)), ())
    _share(records, 6.0, {"relaxed": 7, "low_margin": 9, "examined": 20})
    assert [round(r["wall_s"], 6) for r in records] == [1.0, 3.0, 2.0]
    assert sum(r["relaxed"] for r in records) == 7 and records[0]["relaxed"] == 0  # accepted nothing
    assert sum(r["low_margin"] for r in records) == 9 and sum(r["examined"] for r in records) == 20
    for record in records:
        record.update(suite="s", sample_id=record.pop("sample").id, method="m", rss_mb=1.0, task_score=None)
    row = method_row("m", records, {})
    assert row["tokens_per_s"] == pytest.approx(60 / 6.0)
    assert row["relaxed_share"] == pytest.approx(7 / sum(r["accepted"] for r in records))
    assert row["low_margin_share"] == pytest.approx(9 / 20)


@pytest.mark.parametrize("args, says", [
    (["--engine", "spark"], "--engine spark: expected ours, llama.cpp or vllm"),
    (["--batch-size", "4"], "--batch-size needs --engine vllm"),
    (["--engine", "vllm", "--methods", "strict:head+4x16"], "drafts chains"),
    (["--engine", "vllm", "--repeats", "2"], "drop --repeats"),
    (["--engine", "vllm", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["--engine", "vllm"], "vLLM is not installed in this environment: run `make setup-vllm`"),
])
def test_engine_refusals_are_one_line(capsys, tiny_dir, args, says):
    code = main(["eval", "--target", str(tiny_dir), "--suite", "chat", "--limit", "1", *args])
    err = capsys.readouterr().err
    assert code == 2 and says in err and "Traceback" not in err
