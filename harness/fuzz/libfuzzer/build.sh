#!/bin/bash
set -euo pipefail
# Build the in-process ggml-rpc server fuzz target, OSS-Fuzz style.
#
#   $SRC/llama.cpp        the pin's llama.cpp source tree (or set LLAMA_CPP)
#   $OUT                  where the target, its dictionary and seed corpus go
#   $CC $CXX $CFLAGS $CXXFLAGS $LIB_FUZZING_ENGINE   as OSS-Fuzz sets them, e.g. for libFuzzer
#       CC=clang CXX=clang++ CFLAGS="-fsanitize=address,undefined -fsanitize=fuzzer-no-link"
#       LIB_FUZZING_ENGINE=-fsanitize=fuzzer
#   SEED_CORPUS_DIR       optional: seeds to zip into $OUT/<target>_seed_corpus.zip
#   JOBS                  optional: parallel compile jobs (default 2)
#
# ggml (base + CPU backend) is built from the pin's tree with the same flags, statically; the
# pin's ggml-rpc.cpp is compiled into the harness's translation unit (rpc_server_fuzzer.cpp),
# its transport.cpp is replaced by the harness's in-memory one. Nothing is copied or patched.

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LLAMA_CPP="${LLAMA_CPP:-$SRC/llama.cpp}"
GGML="$LLAMA_CPP/ggml"
RPC_DIR="$GGML/src/ggml-rpc"
TARGET=ggml_rpc_server_fuzzer
WORK="${WORK:-$OUT/work}"
JOBS="${JOBS:-2}"

if [ ! -f "$RPC_DIR/ggml-rpc.cpp" ] || [ ! -f "$RPC_DIR/transport.h" ]; then
    echo "build.sh: $RPC_DIR has no ggml-rpc.cpp + transport.h; the in-process target needs" \
         "a server with the socket_t transport (proto >= 5.0.0)" >&2
    exit 2
fi

DEFS=""
if grep -q 'bool flush()' "$RPC_DIR/transport.h"; then
    DEFS="-DHARNESS_TRANSPORT_FLUSH"  # 7.0.0 added socket_t::flush()
fi

mkdir -p "$OUT" "$WORK"
# A build dir configured from another copy of the tree (the harness unpacks a tree per flag
# set) makes cmake refuse to configure: start it afresh.
if [ -f "$WORK/ggml/CMakeCache.txt" ] && \
        ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$LLAMA_CPP" "$WORK/ggml/CMakeCache.txt"; then
    rm -rf "$WORK/ggml"
fi
# Configured from the top of the tree (sdists do not ship what a standalone ggml build needs),
# but only the ggml targets are built.
cmake -S "$LLAMA_CPP" -B "$WORK/ggml" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
    -DCMAKE_C_FLAGS="$CFLAGS" -DCMAKE_CXX_FLAGS="$CXXFLAGS" \
    -DBUILD_SHARED_LIBS=OFF -DGGML_BACKEND_DL=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
    -DGGML_RPC=OFF -DGGML_BLAS=OFF -DGGML_LLAMAFILE=OFF -DGGML_CCACHE=OFF \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$WORK/cmake.log" 2>&1
cmake --build "$WORK/ggml" --target ggml-base ggml-cpu ggml -j "$JOBS" >"$WORK/ninja.log" 2>&1 || { tail -30 "$WORK/ninja.log" >&2; exit 1; }

LIBS=$(find "$WORK/ggml" -name 'libggml*.a' | sort -r | tr '\n' ' ')
$CXX $CXXFLAGS -std=c++17 $DEFS -DHARNESS_RPC_SOURCE="\"$RPC_DIR/ggml-rpc.cpp\"" \
    -I"$GGML/include" -I"$GGML/src" -I"$RPC_DIR" \
    -c "$HERE/rpc_server_fuzzer.cpp" -o "$WORK/$TARGET.o"
# The static archives reference each other (ggml -> ggml-cpu -> ggml-base): a link group.
$CXX $CXXFLAGS "$WORK/$TARGET.o" -Wl,--start-group $LIBS -Wl,--end-group \
    $LIB_FUZZING_ENGINE -lpthread -ldl -lm -o "$OUT/$TARGET"

cp "$HERE/$TARGET.dict" "$OUT/$TARGET.dict"
if [ -n "${SEED_CORPUS_DIR:-}" ] && [ -d "$SEED_CORPUS_DIR" ]; then
    rm -f "$OUT/${TARGET}_seed_corpus.zip"
    # The files at the top of the zip, named in Python: the sweep's ~29,000 seeds as
    # arguments passed the kernel's limit ("Argument list too long").
    python3 - "$OUT/${TARGET}_seed_corpus.zip" "$SEED_CORPUS_DIR" <<'PY'
import pathlib, sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for p in sorted(pathlib.Path(sys.argv[2]).iterdir()):
        if p.is_file():
            z.write(p, p.name)
PY
fi
echo "built $OUT/$TARGET"
