#!/usr/bin/env bash
# Every test on a fresh Debian 12 machine: install dependencies, build, lint, run the test
# suite (all labels but `slow`; GPU tests report "skipped" without a GPU), fuzz the parsers
# briefly. Set MXQ_TEST_SLOW=1 to include the exhaustive (slow) tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/lint.sh build
label_args=(-LE slow)
if [[ "${MXQ_TEST_SLOW:-0}" == 1 ]]; then label_args=(); fi
(cd build && ctest --output-on-failure -j "$(nproc)" "${label_args[@]}")
if [[ -x scripts/run_fuzzers.sh ]]; then scripts/run_fuzzers.sh "${MXQ_FUZZ_SECONDS:-20}"; fi
