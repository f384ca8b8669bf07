"""vLLM's KV cache on a CPU, sized from the memory at hand (memory.py) instead of vLLM's 92% of all
RAM per engine, for `mars eval --engine vllm` (one engine per drafter) and `mars serve`; and an
engine that does not start as one line. Without vLLM: memory and engines are faked."""

from __future__ import annotations

import pytest

from mars_cli.errors import UserError
from mars_cli.serving import evaluation, memory, serve
from mars_cli.serving.memory import GiB, MiB, MemoryStatus

QUIET = MemoryStatus(available=20 * GiB, total=24 * GiB)
BUSY = MemoryStatus(available=5 * GiB, total=24 * GiB)  # as beside a process holding most of it


@pytest.fixture
def machine(monkeypatch):
    """A CPU machine with no user setting; the test sets its memory."""
    monkeypatch.delenv(memory.ENVIRONMENT_SETTING, raising=False)
    monkeypatch.setattr(memory, "on_cpu", lambda: True)

    def set_memory(status: MemoryStatus) -> None:
        monkeypatch.setattr(memory, "memory_status", lambda: status)
    set_memory(QUIET)
    return set_memory


def test_a_quiet_machine_gets_the_cap_and_engines_share_a_busy_one():
    weights = GiB // 2
    assert memory.kv_cache_bytes(1, weights, 100 * MiB, QUIET) == memory.MAX_KV_BYTES
    alone, shared = (memory.kv_cache_bytes(engines, weights, 100 * MiB, BUSY) for engines in (1, 2))
    assert alone == int((5 * GiB - weights - memory.ENGINE_RUNTIME_BYTES) * memory.KV_SHARE) // MiB * MiB
    assert shared < alone and 2 * (shared + weights + memory.ENGINE_RUNTIME_BYTES) <= BUSY.available
    assert alone % MiB == 0 and shared % MiB == 0


def test_too_little_memory_is_one_line_that_names_the_fix():
    with pytest.raises(UserError) as raised:
        memory.kv_cache_bytes(2, GiB, 512 * MiB, MemoryStatus(available=4 * GiB, total=24 * GiB))
    message = str(raised.value)
    assert "\n" not in message and "not enough memory for 2 vLLM engines" in message
    assert "4.0 of 24.0 GiB available" in message and "VLLM_CPU_KVCACHE_SPACE" in message


@pytest.mark.parametrize("environment, options, expected", [
    ("1", (), "VLLM_CPU_KVCACHE_SPACE"),
    ("", (), None),  # set but empty: vLLM ignores it too
    (None, {"kv_cache_memory_bytes": 1}, "--kv-cache-memory-bytes"),
    (None, {"gpu_memory_utilization": 0.5}, "--gpu-memory-utilization"),
    (None, ("--enforce-eager", "--kv-cache-memory-bytes", "1000000"), "--kv-cache-memory-bytes"),
    (None, ("--gpu-memory-utilization=0.3",), "--gpu-memory-utilization"),
    (None, ("--enforce-eager",), None),
])
def test_a_size_the_user_set_is_theirs(monkeypatch, environment, options, expected):
    monkeypatch.delenv(memory.ENVIRONMENT_SETTING, raising=False)
    if environment is not None:
        monkeypatch.setenv(memory.ENVIRONMENT_SETTING, environment)
    assert memory.user_setting(options) == expected


def test_one_sequence_of_the_longest_length_is_the_floor(tiny_dir):
    per_token = memory.kv_bytes_per_token(tiny_dir, "float32")
    assert per_token == 2 * 2 * 2 * 8 * 4  # keys and values, 2 layers, 2 KV heads of 8, float32
    assert memory.kv_bytes_per_token(tiny_dir, "bfloat16") == per_token // 2
    assert memory.context_length(tiny_dir) == 256
    assert memory.kv_bytes_per_token(tiny_dir / "missing", "float32") == 0


def test_plan_notes_its_choice_and_leaves_gpus_and_user_settings_alone(machine, monkeypatch, tiny_dir):
    size, line = memory.plan_kv_cache(str(tiny_dir), [], "float32", 1024, 2)
    assert size == memory.MAX_KV_BYTES
    assert line.startswith("vLLM on CPU: a KV cache of 2.00 GiB each for 2 engines (20.0 of 24.0 GiB available)")
    monkeypatch.setenv(memory.ENVIRONMENT_SETTING, "1")
    assert memory.plan_kv_cache(str(tiny_dir), [], "float32", 1024, 2) is None
    monkeypatch.delenv(memory.ENVIRONMENT_SETTING)
    monkeypatch.setattr(memory, "on_cpu", lambda: False)
    assert memory.plan_kv_cache(str(tiny_dir), [], "float32", 1024, 2) is None


def test_memory_status_reads_the_kernel():
    status = memory.memory_status()
    assert 0 < status.available <= status.total


class FakeLLM:
    """Stands for vLLM's LLM: records its spec; fails when asked to."""

    started: list = []
    fail_for: str | None = None

    def __init__(self, spec, mars):
        if spec.draft == FakeLLM.fail_for:
            raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
        FakeLLM.started.append(spec)
        self.spec = spec
        self.llm_engine = self
        self.engine_core = self
        self.stopped = False

    def shutdown(self):
        self.stopped = True


@pytest.fixture
def fake_engines(monkeypatch, tiny_dir):
    FakeLLM.started, FakeLLM.fail_for = [], None
    monkeypatch.setattr(evaluation, "build_llm", FakeLLM)
    monkeypatch.setattr(evaluation, "target_directory", lambda spec: str(tiny_dir))
    return FakeLLM


def methods(names: str):
    from mars_cli.evaluation.methods import parse_methods

    return parse_methods(names, [])


def test_eval_engines_share_the_memory_and_a_failed_start_is_one_line(machine, fake_engines, tiny_dir, capsys):
    from mars_cli.options import DecodingOptions, DraftOptions, ModelOptions

    options = DecodingOptions(model=ModelOptions(target=str(tiny_dir)), drafting=DraftOptions(draft="head", num_draft=3))
    machine(BUSY)
    engines = evaluation.start_engines(methods("vanilla,strict,mars"), options, enforce_eager=True)
    sizes = {spec.draft: spec.extra.get("kv_cache_memory_bytes") for spec in fake_engines.started}
    assert set(sizes) == {"none", "head"} and len(set(sizes.values())) == 1
    assert sizes["head"] == memory.kv_cache_bytes(2, memory.weights_bytes(tiny_dir), 0, BUSY)
    assert "a KV cache of" in capsys.readouterr().err
    engines.shutdown()

    fake_engines.started, fake_engines.fail_for = [], "head"
    with pytest.raises(UserError) as raised:
        evaluation.start_engines(methods("vanilla,strict"), options, enforce_eager=True)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("vLLM's engine for --draft head did not start "
                                                      "(Engine core initialization failed.")
    assert "GiB available now" in message and "VLLM_CPU_KVCACHE_SPACE=1" in message
    assert all(llm_spec.draft == "none" for llm_spec in fake_engines.started)  # the first one started, then stopped


def test_serve_sizes_its_engine_unless_told(machine, monkeypatch, tiny_dir):
    from mars_cli.options import VerifyOptions

    request = serve.ServeRequest(str(tiny_dir), draft="ngram", verification=VerifyOptions(verify="strict"))
    chosen = serve.plan(request)
    words = list(chosen.arguments)
    assert words[words.index("--kv-cache-memory-bytes") + 1] == str(memory.MAX_KV_BYTES)
    assert chosen.choices()[-1].startswith("vLLM on CPU: a KV cache of 2.00 GiB for 1 engine")
    told = serve.plan(serve.ServeRequest(str(tiny_dir), draft="ngram", verification=VerifyOptions(verify="strict"),
                                         passthrough=("--kv-cache-memory-bytes", "123456789")))
    assert list(told.arguments).count("--kv-cache-memory-bytes") == 1 and told.kv_cache is None
