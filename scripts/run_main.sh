#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install dependencies, build, run `mxq run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
./build/mxq info
./build/mxq run
