#!/bin/bash -eu
# ClusterFuzzLite's (and OSS-Fuzz's) build step: $SRC, $OUT, $WORK, $CC, $CXX, $CFLAGS,
# $CXXFLAGS and $LIB_FUZZING_ENGINE come from the builder. The harness fetches the pin's sdist
# (sha256-checked) and writes the seed corpus (the generator's sessions and the whole
# deterministic sweep); the project's own OSS-Fuzz-style script builds the target with the
# builder's compiler and flags.
HARNESS_SRC="${HARNESS_SRC:-$SRC/ggml-rpc-harness}"
PIN="${HARNESS_FUZZ_PIN:-p7}"
HARNESS="${HARNESS:-/opt/harness/bin/harness}"
SEEDS="$WORK/seeds-$PIN"
rm -rf "$SEEDS"
LLAMA_CPP="$("$HARNESS" fuzz-prep "$PIN" --seeds "$SEEDS")"
export LLAMA_CPP SEED_CORPUS_DIR="$SEEDS" WORK="$WORK/build-$PIN"
bash "$HARNESS_SRC/harness/fuzz/libfuzzer/build.sh"
