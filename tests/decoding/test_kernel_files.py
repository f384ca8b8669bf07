"""The kernel library's file (decoding/kernels; issue 71 items 11 and 12): a truncated library (a
build killed while linking), one that loads but is not the kernel, and a build that fails each end
in a rebuild or one line, never a signal or a traceback. `python -m mars_cli.decoding.kernels`
exits 1 when the kernels could not be built (`make setup` notices), and on a GGUF `--dtype q4a8`
then exits 2 with one line, `--dtype q4` says it falls back to torch's kernel, and `--dtype auto`
answers without the quantized candidates.

Every check runs in a subprocess (a SIGBUS would kill pytest) against a `MARS_KERNELS` of the
test's own, planted with a copy of the real library, cut or replaced. `CXX=false` makes any
rebuild fail at once; one test rebuilds for real (about a minute)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mars_cli.decoding import kernels

pytestmark = pytest.mark.skipif(kernels.cpu_problem() is not None, reason=f"{kernels.cpu_problem()}")

ROOT = Path(__file__).resolve().parents[2]
NO_COMPILER = {"CXX": "false"}  # torch's builder compiles with $CXX: every rebuild fails at once
PROBE = ("from mars_cli.decoding import kernels, quantized; print(kernels.built()); print(kernels.problem()); "
         "print(quantized.backend())")
# A shared library holding the ops' schema text (as the kernel's does) but registering nothing.
IMPOSTOR_C = """
const char *mars_schemas[] = {"quantized_linear(Tensor x", "quantized_linear_a8(Tensor x", "rms_norm(Tensor x",
                              "attend(Tensor qkv", "silu_mul(Tensor gate_up", "decoder_layer(Tensor x"};
int mars_nothing(void) { return 0; }
"""


@pytest.fixture(scope="module")
def real_library() -> Path:
    """The real kernel library (built where `make setup` put it, else now)."""
    if kernels.cpu_problem() is not None:  # a CPU the kernels are not for: nothing to plant
        pytest.skip(kernels.cpu_problem())
    assert kernels.problem() is None  # where the CPU can run them, they must build
    return kernels.build_dir() / f"{kernels.NAME}.so"


def planted(root: Path, content: bytes) -> Path:
    """`content` where the kernels of `MARS_KERNELS=root` are looked for."""
    folder = root / kernels.build_dir().name
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / f"{kernels.NAME}.so"
    library.write_bytes(content)
    return library


def impostor(tmp_path: Path, with_names: bool) -> bytes:
    """A loadable shared library that defines no mars op (`with_names`: carrying their names)."""
    source = tmp_path / "impostor.c"
    source.write_text(IMPOSTOR_C if with_names else "int mars_nothing(void) { return 0; }\n")
    built = tmp_path / "impostor.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(built), str(source)], check=True)
    return built.read_bytes()


def run(args: list[str], root: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """`python ARGS` with `MARS_KERNELS=root` and `env`, in the repository."""
    environment = {**os.environ, "MARS_KERNELS": str(root), **env}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=timeout)


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def test_a_truncated_library_is_never_mapped(tmp_path, real_library):
    whole = real_library.read_bytes()
    planted(tmp_path / "kernels", whole[: len(whole) // 2])
    done = run(["-c", PROBE], tmp_path / "kernels", **NO_COMPILER)
    assert done.returncode == 0, (done.returncode, done.stderr)  # -7: SIGBUS
    built, problem, backend = done.stdout.splitlines()
    assert built == "False" and backend == "torch"
    assert "truncated" in problem and "could not be rebuilt" in problem and "Traceback" not in done.stderr


@pytest.mark.parametrize("with_names", [False, True], ids=["plain", "with-the-ops-names"])
def test_a_library_that_is_not_the_kernel_is_refused_in_one_line(tmp_path, real_library, with_names):
    planted(tmp_path / "kernels", impostor(tmp_path, with_names))
    done = run(["-c", PROBE], tmp_path / "kernels", **NO_COMPILER)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    built, problem, backend = done.stdout.splitlines()
    assert built == "False" and backend == "torch"
    assert "not this project's kernel library" in problem and "could not be rebuilt" in problem


def test_the_builder_exits_1_in_one_line_when_it_cannot_build(tmp_path):
    (tmp_path / "file").write_text("")
    unwritable = run(["-m", "mars_cli.decoding.kernels"], tmp_path / "file" / "kernels")  # under a plain file
    assert unwritable.returncode == 1 and "Traceback" not in unwritable.stderr, unwritable.stderr
    assert "could not be built" in one_line(unwritable.stdout + unwritable.stderr)
    failing = run(["-m", "mars_cli.decoding.kernels"], tmp_path / "kernels", **NO_COMPILER)
    assert failing.returncode == 1 and "Traceback" not in failing.stderr, failing.stderr
    line = one_line(failing.stdout + failing.stderr)
    assert "could not be built" in line and not line.rstrip().endswith(".so")


def test_the_builder_exits_0_on_a_cpu_that_cannot_run_the_kernels(tmp_path):
    """`make setup` goes on without them there (it stops for a failed build)."""
    code = ("import sys; from mars_cli.decoding import kernels; "
            "kernels.cpu_problem = lambda: 'the q4 kernel needs AVX2 and FMA'; sys.exit(kernels.main())")
    done = run(["-c", code], tmp_path / "kernels", **NO_COMPILER)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert one_line(done.stdout).startswith("mars q4 kernel: not used here: the q4 kernel needs AVX2 and FMA")
    assert not (tmp_path / "kernels").exists()  # nothing built, nothing made


def test_a_library_that_loads_but_is_not_the_kernel_is_rebuilt(tmp_path, real_library):
    """The one real build here (about a minute): the impostor is loaded, refused, deleted, and the
    kernel built beside it under another name, renamed into place and its ops used."""
    library = planted(tmp_path / "kernels", impostor(tmp_path, with_names=True))
    done = run(["-c", PROBE + "; import torch; print(all(hasattr(torch.ops.mars, op) for op in kernels.OPS))"],
               tmp_path / "kernels", timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False", "None", "mars", "True"]  # built() never builds; problem() does
    assert library.stat().st_size > 10_000 and kernels.file_problem(library) is None
    assert sorted(path.name for path in library.parent.iterdir()) == ["build.lock", library.name]
    again = run(["-m", "mars_cli.decoding.kernels"], tmp_path / "kernels")
    assert again.returncode == 0 and again.stdout.strip().endswith(str(library)), again.stderr


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    from tests.models.test_gguf_inputs import write_gguf

    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_a_gguf_with_a_corrupt_library_explicit_modes_say_one_line_and_auto_answers(tmp_path, real_library, gguf):
    whole = real_library.read_bytes()
    planted(tmp_path / "kernels", whole[: len(whole) // 2])
    env = {**NO_COMPILER, "MARS_CACHE": str(tmp_path / "cache")}
    generate = ["-m", "mars_cli.cli", "generate", "abc", "--target", str(gguf), "--device", "cpu", "-n", "3"]
    auto = run([*generate, "--draft", "none", "--json"], tmp_path / "kernels", **env)  # converts the GGUF too
    assert auto.returncode == 0 and "Traceback" not in auto.stderr, auto.stderr
    payload = json.loads(auto.stdout)
    assert payload["config"]["dtype"] in ("float32", "bfloat16")
    assert any("q4 and q4a8" in note and "truncated" in note for note in payload["tuning"]["notes"])
    refused = run([*generate, "--dtype", "q4a8", "--draft", "none"], tmp_path / "kernels", **env)
    assert refused.returncode == 2 and refused.stdout == "" and "Traceback" not in refused.stderr, refused.stderr
    line = one_line(refused.stderr)
    assert line.startswith("mars: error: --dtype q4a8") and "truncated" in line
    fallback = run([*generate, "--dtype", "q4", "--draft", "none"], tmp_path / "kernels", **env)
    assert fallback.returncode == 0, fallback.stderr
    assert "mars: note: --dtype q4 runs on torch's int4 kernel here, not this project's" in fallback.stderr
