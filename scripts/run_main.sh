#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install dependencies, build, run `mxq run` (a
# synthetic gpt-oss-20b-shaped MoE layer, TP=2 with padding, checked against TP=1 unpadded).
# Arguments go to `mxq run`, e.g. scripts/run_main.sh --json.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
./build/mxq run "$@"
