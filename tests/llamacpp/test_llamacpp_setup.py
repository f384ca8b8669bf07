"""--engine llama.cpp where the binding is absent (the main environment), and the flags its build
takes on a machine whose kernel refuses AMX tiles. The engine itself is tested in tests_llamacpp/
(.venv-llamacpp, `make test-llamacpp`)."""

from __future__ import annotations

import importlib.util

import pytest

from mars_cli.cli import main
from mars_cli.llamacpp import build_flags


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None,
                    reason="llama-cpp-python is installed here: tests_llamacpp/ runs the engine")
def test_without_the_binding_the_engine_is_one_line_naming_the_setup(capsys):
    code = main(["generate", "hello", "--engine", "llama.cpp", "-n", "4"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1
    assert "make setup-llamacpp" in err[0] and "compiler" in err[0]


def test_a_gguf_is_required(capsys, tiny_dir):
    code = main(["generate", "hello", "--engine", "llama.cpp", "--target", str(tiny_dir), "-n", "4"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and "--engine llama.cpp runs GGUF files" in err[-1]


AMX_CPU = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"}


def test_amx_refused_by_the_kernel_builds_without_it():
    args = build_flags.cmake_args(AMX_CPU, amx=False)
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AMX_TILE=OFF" in args and "-DGGML_AMX_INT8=OFF" in args
    assert "-DGGML_AVX512=ON" in args and "-DGGML_AVX512_BF16=ON" in args and "-DGGML_AVX512_VNNI=OFF" in args


@pytest.mark.parametrize("flags, amx", [(AMX_CPU, True), ({"avx", "avx2", "avx512f"}, None)])
def test_a_machine_whose_tiles_work_or_that_has_none_builds_natively(flags, amx):
    assert build_flags.cmake_args(flags, amx=amx) == []


def test_this_machine_gets_flags_it_can_run():
    args = build_flags.cmake_args()
    assert args == [] or "-DGGML_AMX_TILE=OFF" in args  # native, or AMX off where the kernel refuses it
