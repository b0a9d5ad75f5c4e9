#!/bin/bash
# llama.cpp's Python binding for bench/generate/peers.py and levers.py, built from its PyPI sdist into a venv of its
# own (never on warmstart's run-time path), the wheel cached for the next machine:
#
#   nice -n 19 bench/generate/build_llama.sh [CACHE]        # CACHE: /work/cache by default
#
# CACHE/llama-src/llama_cpp_python-VERSION/   the sdist, unpacked (its vendor/llama.cpp: convert_hf_to_gguf.py, gguf-py)
# CACHE/wheels/llama_cpp_python-VERSION-*.whl the wheel (CPU, -march=native), reused when present
# CACHE/llama-venv/                           the venv (READY once it imports), LLAMA_VENV in peers.py
#
# Only the libraries the binding loads are built (no llava/mtmd, tools, server). Where the CPU reports AMX but the
# machine faults on its tile instructions (this host: a VM; ggml's AMX buffer type dies with a general protection
# fault in libggml-cpu.so on the first decode), libggml-cpu.so is rebuilt from the same sources with AVX-512/VNNI
# and without AMX, and replaces the wheel's in the venv (the AMX one kept beside it as .amx): llama.cpp's other
# weight repacking (REPACK: Q4_0 interleaved for AVX-512) stays on, as it is for every CPU without AMX.
set -euo pipefail
VERSION=0.3.36
CACHE=${1:-/work/cache}
SRC=$CACHE/llama-src
VENV=$CACHE/llama-venv
mkdir -p "$SRC" "$CACHE/wheels"
cd "$SRC"
[ -f llama_cpp_python-$VERSION.tar.gz ] || python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d .
[ -d llama_cpp_python-$VERSION ] || tar xzf llama_cpp_python-$VERSION.tar.gz
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
OFF="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
if ! ls "$CACHE"/wheels/llama_cpp_python-$VERSION-*.whl >/dev/null 2>&1; then
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF $OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
        "$VENV/bin/pip" wheel --no-deps -w "$CACHE/wheels" ./llama_cpp_python-$VERSION
fi
"$VENV/bin/pip" install -q "$CACHE"/wheels/llama_cpp_python-$VERSION-*.whl
LIB=$("$VENV/bin/python" -c "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / 'lib')")
probe() { "$VENV/bin/python" -c "
import llama_cpp, sys
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
print('decoded', next(iter(llm.generate([1, 2, 3], top_k=1, temp=0.0))))" "$1"; }
if grep -qw amx_int8 /proc/cpuinfo && [ -n "${PROBE_GGUF:-}" ] && ! probe "$PROBE_GGUF"; then
    BUILD=$SRC/ggml-noamx
    cmake -S "$SRC/llama_cpp_python-$VERSION/vendor/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
        -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
        -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_COMMON=OFF $OFF
    cmake --build "$BUILD" -j 2 --target ggml-cpu
    built=$(readlink -f "$BUILD/bin/libggml-cpu.so")
    [ -f "$LIB/libggml-cpu.so.amx" ] || cp "$LIB/libggml-cpu.so" "$LIB/libggml-cpu.so.amx"
    for so in "$LIB"/libggml-cpu.so "$LIB"/libggml-cpu.so.[0-9]*; do  # the wheel holds copies, not links
        case $so in *.amx) ;; *) cp "$built" "$so" ;; esac
    done
    probe "$PROBE_GGUF"
fi
"$VENV/bin/python" -c "import llama_cpp; print(llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())"
touch "$VENV/READY"
