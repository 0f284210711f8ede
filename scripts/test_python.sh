#!/usr/bin/env bash
# Builds and tests the Python package: a venv under build-python/venv with the PyPI packages,
# `pip install .` (CMake build kept in build-python/<wheel tag> between runs, for incremental
# rebuilds: this script's own opt-in, -Cbuild-dir; MXQ_PYTHON_BUILD_DIR names another folder, and
# a plain `pip install .` builds in a temporary folder), then pytest tests/python.
# CUDA follows MXQ_CUDA (AUTO by default, as in the C++ build); warnings are errors here.
# PyTorch (for torch.ops.mxq and its tests) and transformers >= 5.17 with accelerate (for
# mxq.integrations.transformers) come from PyPI into the venv, and their tests are then required
# (MXQ_REQUIRE_TORCH=1: a missing torch or transformers fails the run instead of skipping the
# tests); MXQ_PYTHON_TORCH=0 leaves them out. A cold install is ~3 GB of wheels (torch and its
# CUDA libraries): about a minute at 100 MB/s, seconds when already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build-python/venv
python=${PYTHON:-python3}
if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet scikit-build-core nanobind numpy ml_dtypes pytest safetensors
if [[ "${MXQ_PYTHON_TORCH:-1}" == 1 ]]; then
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    # torch with its CUDA libraries unpacks to ~5.6 GB beside ~3 GB of downloaded wheels: say so
    # before pip runs out of disk halfway (no cache copy of the wheels: --no-cache-dir).
    free_kib=$(df -Pk "$venv" | awk 'NR == 2 { print $4 }')
    if ((free_kib < 8 * 1024 * 1024)); then
      echo "test_python.sh: installing torch into $venv needs ~9 GB free there;" \
        "$((free_kib / 1024)) MiB are (MXQ_PYTHON_TORCH=0 leaves torch and its tests out)" >&2
      exit 1
    fi
    echo "test_python.sh: installing torch from PyPI into $venv" >&2
    start=$SECONDS
    "$venv/bin/python" -m pip install --quiet --no-cache-dir torch
    echo "test_python.sh: torch installed in $((SECONDS - start)) s" >&2
  fi
  # mxq.integrations.transformers and its tests (tests/python/test_transformers_*.py; accelerate
  # loads transformers' quantized checkpoints); required with torch, like torch.
  "$venv/bin/python" -m pip install --quiet --no-cache-dir "transformers>=5.17" accelerate
  export MXQ_REQUIRE_TORCH=1
fi
# No build isolation: the build uses the venv's nanobind and keeps its CMake cache between runs.
MXQ_WERROR="${MXQ_WERROR:-ON}" "$venv/bin/python" -m pip install --quiet --no-build-isolation \
  --force-reinstall --no-deps -Cbuild-dir="${MXQ_PYTHON_BUILD_DIR:-build-python/{wheel_tag\}}" .
set +e
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/python "$@"
status=$?
set -e
if [[ $status -eq 5 ]]; then
  echo "test_python.sh: pytest collected no tests" >&2
  exit 1
fi
exit $status
