"""`mars profile`: the report's keys and arithmetic, sweeps, and the files it writes."""

from __future__ import annotations

import json

import pytest

from mars_cli.cli import main
from mars_cli.decoding.stats import DecodeStats
from mars_cli.profiling import parse_range, throughput_by_position
from mars_cli.errors import UserError


@pytest.fixture(scope="module")
def report_and_files(tiny_dir, tmp_path_factory):
    import io
    from contextlib import redirect_stdout

    folder = tmp_path_factory.mktemp("profile")
    plot, trace = folder / "charts.png", folder / "trace.json"
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(["profile", "abc abc abc abc", "--target", str(tiny_dir), "--device", "cpu", "-n", "40",
                     "--verify", "mars", "--sweep-num-draft", "1:3", "--overhead-repeats", "1",
                     "--bucket", "8", "--json", "--plot", str(plot), "--trace", str(trace)])
    assert code == 0
    return json.loads(buffer.getvalue()), plot, trace


def test_report_has_documented_keys(report_and_files):
    report, _, _ = report_and_files
    assert {"config", "stats", "memory", "time_split", "accepted_length_histogram", "per_position_acceptance",
            "margins", "by_position", "num_draft_sweep", "instrumentation", "plot", "trace"} <= report.keys()
    assert report["memory"]["peak_rss_mb"] > 0
    assert {"measure", "threshold", "values", "share_above"} <= report["margins"].keys()
    assert len(report["margins"]["values"]) == report["stats"]["new_tokens"]


def test_time_split_sums_to_wall_time(report_and_files):
    """Every entry of the split is a part of the wall: summing them all gives the wall, no more."""
    report, _, _ = report_and_files
    split = report["time_split"]
    assert sum(entry["seconds"] for entry in split.values()) == pytest.approx(report["stats"]["wall_s"], rel=1e-3)
    assert sum(entry["share"] for entry in split.values()) == pytest.approx(1.0, rel=1e-3)
    outside = report["outside_forwards"]
    assert set(outside["phases"]) == {"verify", "rollback", "other"}
    assert outside["seconds"] == pytest.approx(sum(split[phase]["seconds"] for phase in outside["phases"]), rel=1e-9)


def test_sweep_has_one_row_per_draft_length(report_and_files):
    report, _, _ = report_and_files
    rows = report["num_draft_sweep"]
    assert [row["num_draft"] for row in rows] == [1, 2, 3]
    assert sum(row["best"] for row in rows) == 1
    best = max(rows, key=lambda row: row["tokens_per_s"])
    assert best["best"]


def test_plot_and_trace_files_are_valid(report_and_files):
    _, plot, trace = report_and_files
    import matplotlib.image

    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(plot).shape[0] > 100
    events = json.loads(trace.read_text())["traceEvents"]
    assert any("aten::" in str(event.get("name", "")) for event in events)


def test_throughput_buckets_cover_the_output():
    stats = DecodeStats()
    stats.phase_s["prefill"] = 1.0
    stats.round_ends = [(1.5, 4), (2.0, 8), (2.5, 12), (3.0, 16), (4.0, 20)]
    rows = throughput_by_position(stats, 8)
    assert [(r["from"], r["to"]) for r in rows] == [(0, 8), (8, 16)]
    assert rows[0]["tokens_per_s"] == pytest.approx(8.0) and rows[1]["tokens_per_s"] == pytest.approx(8.0)


def test_bad_sweep_is_refused():
    assert parse_range("2,4,8") == [2, 4, 8]
    for text in ("0:4", "a:b", "1:100"):
        with pytest.raises(UserError):
            parse_range(text)


def test_profile_refuses_directory_as_plot(capsys, tmp_path, tiny_dir):
    code = main(["profile", "--target", str(tiny_dir), "--plot", str(tmp_path), "--device", "cpu"])
    assert code == 2 and "directory" in capsys.readouterr().err


def test_profile_shows_the_draft_tree(capsys, tiny_dir):
    """With a tree shape the report's config names it, its stats carry the tree's rounds, and the
    rendered profile has a "draft tree" row."""
    args = ["profile", "xa ya za xb yb zb xa ya za xb yb", "--target", str(tiny_dir), "--device", "cpu", "-n", "24",
            "--raw", "--num-draft", "3", "--draft-topk", "3", "--draft-tokens", "8", "--overhead-repeats", "1"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["tree_topk"] == 3 and report["config"]["tree_tokens"] == 8
    tree = report["stats"]["tree"]
    assert tree is not None and tree["rounds"] > 0 and 1 <= tree["max_depth"] <= 3
    assert main(args) == 0
    assert "draft tree" in capsys.readouterr().out
