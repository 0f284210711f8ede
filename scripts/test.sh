#!/usr/bin/env bash
# Every test on a fresh Debian 12 machine: install dependencies, build, lint, run the whole test
# suite (the exhaustive `slow` codec sweeps included; GPU tests report "skipped" without a GPU),
# fuzz the parsers briefly. MXQ_TEST_QUICK=1 leaves the `slow` label out.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/lint.sh build
label_args=()
if [[ "${MXQ_TEST_QUICK:-0}" == 1 ]]; then label_args=(-LE slow); fi
(cd build && ctest --output-on-failure -j "$(nproc)" "${label_args[@]}")
if [[ -x scripts/run_fuzzers.sh ]]; then scripts/run_fuzzers.sh "${MXQ_FUZZ_SECONDS:-20}"; fi
