#!/usr/bin/env bash
# Builds and tests the Python package: a venv under build-python/venv with the PyPI packages,
# `pip install .` (CMake build cached in build-python/<wheel tag>), then pytest tests/python.
# CUDA follows MXQ_CUDA (AUTO by default, as in the C++ build); warnings are errors here.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build-python/venv
python=${PYTHON:-python3}
if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet scikit-build-core nanobind numpy ml_dtypes pytest safetensors
# No build isolation: the build uses the venv's nanobind and keeps its CMake cache between runs.
MXQ_WERROR="${MXQ_WERROR:-ON}" "$venv/bin/python" -m pip install --quiet --no-build-isolation \
  --force-reinstall --no-deps .
set +e
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/python "$@"
status=$?
set -e
if [[ $status -eq 5 ]]; then
  echo "test_python.sh: pytest collected no tests" >&2
  exit 1
fi
exit $status
