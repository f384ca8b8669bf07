#!/usr/bin/env bash
# Build llama.cpp's own llama-bench from the llama-cpp-python source pinned in pyproject.toml (the
# same llama.cpp commit the binding runs), with the flags `make setup-llamacpp` used on this
# machine. Prints the binary's path. Cached under $MARS_CACHE (or ~/.cache/mars-cli).
#   bash benchmarks/tools/build_llama_bench.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
version="$(grep -o 'llama-cpp-python==[0-9.]*' "$here/pyproject.toml" | cut -d= -f3)"
cache="${MARS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mars-cli}/llama.cpp-$version"
binary="$cache/build/bin/llama-bench"
if [ ! -x "$binary" ]; then
  mkdir -p "$cache"
  python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$cache" >&2
  tar -xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache"
  source="$cache/llama_cpp_python-$version/vendor/llama.cpp"
  # shellcheck disable=SC2046
  cmake -S "$source" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    $(python3 "$here/mars_cli/llamacpp/build_flags.py") >&2
  cmake --build "$cache/build" --target llama-bench -j "$(nproc)" >&2
fi
echo "$binary"
