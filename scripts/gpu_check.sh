#!/usr/bin/env bash
# Runs on the GPU machine (see docs/DEVELOPING.md): builds with the system compilers and the
# staged dependencies, runs the GPU tests, then whatever extra command is given (benchmarks).
# Logs go to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/mxq-out}"
mkdir -p "$out"
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
# NCCL: the toolkit's when it has one, else the pip wheel nvidia-nccl-cu13 of python3 (its
# package folder holds include/ and lib/).
nccl_args=()
if [[ ! -f /usr/local/cuda/include/nccl.h ]] &&
  nccl_root=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null); then
  nccl_args=(-DNCCL_ROOT="$nccl_root")
fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMXQ_CUDA=ON "${nccl_args[@]}" \
  -DMXQ_DEPS_DIR="$PWD/.deps" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
grep -E 'mxq: (CUDA|NCCL)' "$out/configure.log"
# MXQ_BUILD_TARGETS="a b": only those targets (a short call that needs the CLI and a few tests).
targets=()
for t in ${MXQ_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
# MXQ_BUILD_JOBS: parallel jobs (default: every core; scripts/gpu_ab.sh shares them among builds).
cmake --build build-gpu -j "${MXQ_BUILD_JOBS:-$(nproc)}" "${targets[@]}" >"$out/build.log" 2>&1 || { grep -E -A3 'error|FAILED' "$out/build.log" | head -60; exit 1; }
echo "build ok"
# MXQ_SKIP_GPU_TESTS=1: build only (a second device call that only benches).
if [[ "${MXQ_SKIP_GPU_TESTS:-0}" != 1 ]]; then
  (cd build-gpu && ctest -L gpu --output-on-failure 2>&1 | tee "$out/ctest_gpu.log" | tail -25)
fi
# MXQ_SKIP_CPU_TESTS=1 leaves the CPU tests to this machine's CI run (saves device time).
if [[ "${MXQ_SKIP_CPU_TESTS:-0}" != 1 ]]; then
  (cd build-gpu && ctest -LE 'gpu|slow' -j 8 2>&1 | tee "$out/ctest_cpu.log" | tail -6)
fi
if (($# > 0)); then "$@"; fi
