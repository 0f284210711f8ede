#!/usr/bin/env bash
# Runs on the GPU machine (see docs/DEVELOPING.md; carry .deps from scripts/stage_deps.sh): builds
# and installs the Python package with CUDA into the machine's python3 (which has torch, CuPy,
# nanobind and scikit-build-core; it is offline, so no build isolation), then runs tests/python
# with the torch and CUDA tests required (a missing torch or GPU fails instead of skipping).
# Logs go to $OUT when set; extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/mxq-out}"
mkdir -p "$out"
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
export PATH="/usr/local/cuda/bin:$PATH"
python=${PYTHON:-python3}
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' |
  tee "$out/python_env.txt"
# -Cbuild-dir keeps the CMake build between calls on a warm machine (incremental rebuilds; a
# plain `pip install .` would build in a temporary folder each time).
MXQ_CUDA=ON MXQ_WERROR=ON "$python" -m pip install --no-build-isolation --no-deps \
  --force-reinstall -Cbuild-dir="build-python/{wheel_tag}" \
  -Ccmake.define.MXQ_DEPS_DIR="$PWD/.deps" . >"$out/pip_install.log" 2>&1 ||
  { grep -E -B2 -A6 'error|FAILED' "$out/pip_install.log" | head -80; exit 1; }
echo "python package built with CUDA"
MXQ_REQUIRE_TORCH=1 MXQ_REQUIRE_CUDA=1 "$python" -m pytest -q -p no:cacheprovider -rs \
  tests/python "$@" 2>&1 | tee "$out/pytest.log" | tail -40
exit "${PIPESTATUS[0]}"
