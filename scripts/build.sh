#!/usr/bin/env bash
# Configures and builds mxq into ./build (Ninja, Release). Extra arguments go to CMake's
# configure step, e.g. scripts/build.sh -DMXQ_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"
