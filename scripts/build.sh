#!/usr/bin/env bash
# Configures and builds mxq into ./build (Ninja, Release). Extra arguments go to CMake's
# configure step, e.g. scripts/build.sh -DMXQ_CUDA=OFF. MXQ_BUILD_DIR names another build folder;
# MXQ_BUILD_TARGET builds one target only (e.g. mxq_cli: the library and the `mxq` tool).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
build_dir="${MXQ_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
target_args=()
if [[ -n "${MXQ_BUILD_TARGET:-}" ]]; then target_args=(--target "$MXQ_BUILD_TARGET"); fi
cmake --build "$build_dir" -j "$(nproc)" "${target_args[@]}"
