#!/bin/bash
# llama.cpp's llama-server (the peer of bench/generate/streams.py's `llama` variant: continuous batching over N
# parallel slots) and llama-quantize, built from the same vendored sources as build_llama.sh's binding, static,
# without AMX (this host is a VM that faults on AMX tile instructions; see build_llama.sh), AVX2/AVX-512/VNNI on:
#
#   nice -n 19 bench/generate/build_llama_server.sh [CACHE]      # CACHE: /work/cache by default
#
# CACHE/llama-server/bin/{llama-server,llama-quantize}   the binaries (READY once llama-server --version runs)
# Needs CACHE/llama-src/llama_cpp_python-VERSION/ (run build_llama.sh first: it unpacks the sdist).
set -euo pipefail
VERSION=0.3.36
CACHE=${1:-/work/cache}
SRC=$CACHE/llama-src/llama_cpp_python-$VERSION/vendor/llama.cpp
BUILD=$CACHE/llama-src/server-build
OUT=$CACHE/llama-server
[ -f "$SRC/CMakeLists.txt" ] || { echo "no llama.cpp sources at $SRC: run build_llama.sh first" >&2; exit 1; }
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
    -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_OPENMP=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_COMMON=ON
cmake --build "$BUILD" -j 2 --target llama-server llama-quantize
mkdir -p "$OUT/bin"
cp "$BUILD/bin/llama-server" "$BUILD/bin/llama-quantize" "$OUT/bin/"
"$OUT/bin/llama-server" --version
touch "$OUT/READY"
