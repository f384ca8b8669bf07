"""`--engine auto` (mars_cli/engine_choice.py), `mars generate`'s default: transformers wherever
llama.cpp cannot serve the request, with the reason; otherwise both engines' sessions decode,
interleaved, the faster wins and is cached, and a verdict taken on a busy machine is measured
again once it is quiet. Sessions and their rates are stand-ins here (tests_llamacpp runs the real
pair); the resolution's bookkeeping is real."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from mars_cli import engine_choice
from mars_cli.options import DecodingOptions
from tests.cli.test_cli import run_cli


@dataclass
class Stats:
    new_tokens: int
    wall_s: float


class FakeSession:
    """A session whose decodes take a fixed time a token, by engine; runs counted."""

    def __init__(self, options: DecodingOptions, ms_per_token: dict[str, float], runs: list[str]) -> None:
        self.options, self.engine = options, options.model.engine
        self.ms, self.runs = ms_per_token, runs

    def settings(self):
        from mars_cli.decoding.loop import DecodeSettings

        return DecodeSettings(max_new_tokens=128)

    def run(self, prompt, settings=None):
        self.runs.append(self.engine)
        tokens = settings.max_new_tokens

        class Result:
            stats = Stats(tokens, tokens * self.ms[self.engine] / 1000)
        return Result()


@pytest.fixture
def gguf_target(tmp_path, monkeypatch):
    """llama.cpp installed, and a target that resolves to a GGUF file (its bytes are hashed for the key)."""
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(64))
    monkeypatch.setattr(engine_choice, "llamacpp_installed", lambda: True)
    from mars_cli.models import loading

    monkeypatch.setattr(loading, "resolve_spec", lambda spec: (path, path.name) if spec.endswith(".gguf")
                        else (Path(spec), None))
    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    return str(path)


def builder(ms_per_token: dict[str, float]):
    built: list[str] = []
    runs: list[str] = []

    def build(options: DecodingOptions) -> FakeSession:
        built.append(options.model.engine)
        return FakeSession(options, ms_per_token, runs)

    return build, built, runs


def options_for(target: str, **changes: object) -> DecodingOptions:
    return DecodingOptions.of(**{"target": target, "engine": "auto", "draft": "auto", **changes})


def test_the_faster_engine_is_chosen_cached_and_read_back(gguf_target, monkeypatch):
    monkeypatch.setattr(engine_choice, "_busy", lambda: None)
    build, built, runs = builder({"transformers": 25.0, "llama.cpp": 10.0})
    resolved, session, choice = engine_choice.resolve(options_for(gguf_target), build)
    assert resolved.model.engine == "llama.cpp" and choice.engine == "llama.cpp" and not choice.cached
    assert sorted(built) == ["llama.cpp", "transformers"] and session.engine == "llama.cpp"  # reused, not rebuilt
    # a warm-up each, then ROUNDS timed decodes each, interleaved
    assert runs == ["transformers", "llama.cpp"] * (engine_choice.ROUNDS + 1)
    assert choice.tok_s == {"transformers": pytest.approx(40.0), "llama.cpp": pytest.approx(100.0)}
    assert "100.0 tok/s on llama.cpp, 40.0 on transformers" in choice.why
    build, built, runs = builder({"transformers": 1.0, "llama.cpp": 99.0})
    again, session, cached = engine_choice.resolve(options_for(gguf_target), build)
    assert again.model.engine == "llama.cpp" and cached.cached and session is None and built == [] == runs


def test_transformers_wins_a_tie_and_a_slower_llamacpp(gguf_target, monkeypatch):
    monkeypatch.setattr(engine_choice, "_busy", lambda: None)
    for ms in ({"transformers": 10.0, "llama.cpp": 10.0}, {"transformers": 10.0, "llama.cpp": 30.0}):
        build, _, _ = builder(ms)
        resolved, _, choice = engine_choice.resolve(options_for(gguf_target, draft="ngram" if ms["llama.cpp"] > 10
                                                                else "auto"), build)
        assert resolved.model.engine == "transformers" == choice.engine


def test_a_verdict_from_a_busy_machine_is_measured_again_once_it_is_quiet(gguf_target, monkeypatch):
    busy = ["load average 3.1 on 2 cores"]
    monkeypatch.setattr(engine_choice, "_busy", lambda: busy[0])
    build, built, _ = builder({"transformers": 25.0, "llama.cpp": 10.0})
    _, _, first = engine_choice.resolve(options_for(gguf_target), build)
    assert first.provisional == "load average 3.1 on 2 cores"
    build, built, _ = builder({"transformers": 25.0, "llama.cpp": 10.0})
    _, _, still_busy = engine_choice.resolve(options_for(gguf_target), build)
    assert still_busy.cached and built == []  # busy still: the provisional verdict stands
    busy[0] = None
    build, built, _ = builder({"transformers": 5.0, "llama.cpp": 10.0})
    resolved, _, quiet = engine_choice.resolve(options_for(gguf_target), build)
    assert sorted(built) == ["llama.cpp", "transformers"] and quiet.provisional is None
    assert resolved.model.engine == "transformers"


@pytest.mark.parametrize("text", ["not json", json.dumps({"schema": 1, "engine": "vllm"}), "[]"])
def test_a_malformed_entry_is_measured_again(gguf_target, monkeypatch, text):
    monkeypatch.setattr(engine_choice, "_busy", lambda: None)
    options = options_for(gguf_target)
    path = engine_choice.entry_path(engine_choice.choice_key(options))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    build, built, _ = builder({"transformers": 25.0, "llama.cpp": 10.0})
    _, _, choice = engine_choice.resolve(options, build)
    assert not choice.cached and sorted(built) == ["llama.cpp", "transformers"]
    assert json.loads(path.read_text())["engine"] == "llama.cpp"


@pytest.mark.parametrize("changes, reason", [
    ({"dtype": "q4"}, "--dtype q4 is a transformers dtype"),
    ({"draft": "head"}, "a draft head reads hidden states"),
    ({"device": "cuda"}, "llama.cpp runs on the CPU only"),
    ({"compile": "on"}, "--compile on compiles transformers forwards"),
])
def test_options_only_transformers_can_take_need_no_measuring(gguf_target, changes, reason):
    build, built, _ = builder({"transformers": 25.0, "llama.cpp": 10.0})
    resolved, session, choice = engine_choice.resolve(options_for(gguf_target, **changes), build)
    assert resolved.model.engine == "transformers" and session is None and built == []
    assert reason in choice.why


def test_a_model_directory_or_no_llamacpp_is_transformers_with_the_reason(tiny_dir, gguf_target, monkeypatch):
    build, built, _ = builder({"transformers": 25.0, "llama.cpp": 10.0})
    _, _, choice = engine_choice.resolve(options_for(str(tiny_dir)), build)
    assert choice.engine == "transformers" and choice.why == "the target is not a GGUF file"
    monkeypatch.setattr(engine_choice, "llamacpp_installed", lambda: False)
    _, _, choice = engine_choice.resolve(options_for(gguf_target), build)
    assert "llama-cpp-python is not installed" in choice.why and built == []


def test_an_explicit_engine_is_left_alone(gguf_target):
    build, built, _ = builder({"transformers": 25.0, "llama.cpp": 10.0})
    options = DecodingOptions.of(target=gguf_target, engine="llama.cpp")
    assert engine_choice.resolve(options, build) == (options, None, None) and built == []


def test_generate_says_which_engine_and_why(capsys, tiny_dir, cache):
    code, out, err = run_cli(capsys, "generate", "abc", "--target", str(tiny_dir), "--device", "cpu", "-n", "4",
                             "--draft", "none", "--json")
    assert code == 0, err
    config = json.loads(out)["config"]
    assert config["engine"] == "transformers" and config["engine_choice"]["engine"] == "transformers"
    code, _, err = run_cli(capsys, "generate", "abc", "--target", str(tiny_dir), "--device", "cpu", "-n", "4",
                           "--draft", "none", "--stats")
    assert code == 0 and "--engine auto:" in err


def test_other_commands_name_an_engine(capsys, tiny_dir, cache):
    code, _, err = run_cli(capsys, "profile", "--target", str(tiny_dir), "--device", "cpu", "--engine", "auto",
                           "abc", "-n", "4")
    assert code == 2 and "--engine auto is resolved by `mars generate`" in err


def test_an_engine_that_cannot_load_the_target_leaves_the_other(gguf_target, monkeypatch):
    from mars_cli.errors import UserError

    monkeypatch.setattr(engine_choice, "_busy", lambda: None)
    build, built, runs = builder({"transformers": 25.0, "llama.cpp": 10.0})

    def refusing(options):
        if options.model.engine == "llama.cpp":
            raise UserError("unknown model architecture: 'newarch'")
        return build(options)

    resolved, session, choice = engine_choice.resolve(options_for(gguf_target), refusing)
    assert resolved.model.engine == "transformers" == session.engine and runs == []
    assert choice.why == "llama.cpp cannot serve this target (unknown model architecture: 'newarch')"
    assert not engine_choice.entry_path(engine_choice.choice_key(options_for(gguf_target))).exists()
