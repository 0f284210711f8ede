#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install dependencies, build, run `mxq run` (a
# synthetic gpt-oss-20b-shaped MoE layer, TP=2 with padding, checked against TP=1 unpadded).
# Arguments go to `mxq run`, e.g. scripts/run_main.sh --json.
# --no-tests (first argument) builds only what the main job needs (the library and the `mxq`
# tool, no tests or benchmarks) into its own folder build-main/, so ./build keeps its options.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
if [[ "${1:-}" == --no-tests ]]; then
  shift
  MXQ_BUILD_DIR=build-main MXQ_BUILD_TARGET=mxq_cli scripts/build.sh -DMXQ_BUILD_TESTS=OFF \
    -DMXQ_BUILD_BENCH=OFF
  exec ./build-main/mxq run "$@"
fi
scripts/build.sh
./build/mxq run "$@"
