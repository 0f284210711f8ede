#!/usr/bin/env bash
# Every test on a fresh Debian 12 machine: install dependencies, build, lint, run the whole test
# suite (the exhaustive `slow` codec sweeps included; GPU tests report "skipped" without a GPU),
# the CPU tests of a build without CUDA, the Python package's tests (a venv from PyPI), fuzz the
# parsers briefly. MXQ_TEST_QUICK=1 leaves the `slow` label and the build without CUDA out.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/lint.sh build
label_args=()
if [[ "${MXQ_TEST_QUICK:-0}" == 1 ]]; then label_args=(-LE slow); fi
(cd build && ctest --output-on-failure -j "$(nproc)" "${label_args[@]}")
# Where that build has the CUDA kernels, a second one without them (MXQ_CUDA=OFF: every machine
# without the toolkit builds so) and its CPU tests, so that no CPU behaviour depends on the CUDA
# code being compiled in (about 8 minutes on 2 cores; MXQ_TEST_QUICK=1 leaves it out).
build_info=$(build/mxq info)
if [[ "${MXQ_TEST_QUICK:-0}" != 1 && "$build_info" == *$'\nbuild: CUDA on'* ]]; then
  MXQ_BUILD_DIR=build-no-cuda scripts/build.sh -DMXQ_CUDA=OFF
  (cd build-no-cuda && ctest --output-on-failure -j "$(nproc)" -L cpu)
fi
scripts/test_python.sh
if [[ -x scripts/run_fuzzers.sh ]]; then scripts/run_fuzzers.sh "${MXQ_FUZZ_SECONDS:-20}"; fi
