#!/usr/bin/env bash
# One device call that checks everything and records the numbers (device time is scarce and the
# machine goes back after a short idle time, so a session's checks travel together):
#   1. scripts/gpu_check.sh: build, ctest -L gpu (CPU tests skipped);
#   2. the Python package with CUDA and tests/python (scripts/gpu_python_check.sh), built and run
#      in the background while 3. runs the sanitizers;
#   3. compute-sanitizer memcheck on the engine-facing MoE op, the distributed layer and the
#      wgmma GEMMs' ring-wrapping and scale-spread cases; racecheck on the W4A8 wgmma GEMMs;
#      both on the linear tiles at a ragged N (the cluster tile's multicast);
#   4. the benches, one JSON file each in $OUT, named as docs/perf-data/README.md says; with
#      .peers/deepgemm staged and carried, DeepGEMM built and timed beside mxq.
# Run there with carry [".deps"]; each step's log is in $OUT even when a later step runs out of time.
# One device command may run 10 minutes: `gpu_session.sh tests` runs 1.-3., `gpu_session.sh benches`
# (a second call on the same warm machine: the build is incremental) runs 4.; no argument runs all.
# `quick` (about 7 minutes) runs the build, the never-run kernels' tests and the deciding benches;
# after it, `MXQ_SKIP_SMOKES=1 gpu_session.sh tests` on the same machine runs the rest of 1.-3.
set -uo pipefail
part="${1:-all}"
case "$part" in
  all | tests | benches | quick) ;;
  *) echo "usage: scripts/gpu_session.sh [all|tests|benches|quick]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/mxq-out}"
mkdir -p "$out"
day=$(date -u +%F)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -E 'H[0-9]+' | tr 'A-Z' 'a-z')
stamp() { echo "== $(date -u +%T) $*"; }

# The kernels not yet run on a GPU first, each under a time limit: a deadlock shows in three
# minutes instead of taking the whole call, and the GPU tests then leave that binary out.
skip=()  # ctest names ctest need not run
run_smokes() {
  # MXQ_SKIP_SMOKES=1: a `quick` call on this machine already ran them; ctest runs those tests.
  [[ "${MXQ_SKIP_SMOKES:-0}" == 1 ]] && return 0
  for smoke in "moe.moe_forward_gpu_test|test_moe_moe_forward_gpu_test|Shapes/MoeGpuW4a8VsCpu.*" \
    "linear.linear_gpu_test|test_linear_linear_gpu_test|*"; do
    IFS='|' read -r name binary filter <<<"$smoke"
    stamp "smoke $name ($filter)"
    timeout 180 "build-gpu/tests/$binary" --gtest_filter="$filter" >"$out/smoke_$binary.log" 2>&1
    local rc=$?
    echo "$name smoke rc=$rc"; grep -E '^\[  (PASSED|FAILED)' "$out/smoke_$binary.log" | head -20
    # Timed out: left out of ctest. Run whole (filter *): its result is the smoke's.
    if ((rc == 124)) || [[ "$filter" == "*" ]]; then skip+=("$name"); fi
  done
}

# 1.-3.: the build, the GPU tests, the Python package and its tests, the sanitizers.
run_tests() {
  stamp build
  MXQ_SKIP_CPU_TESTS=1 MXQ_SKIP_GPU_TESTS=1 scripts/gpu_check.sh || return 1
  run_smokes
  stamp GPU tests
  local exclude=()
  if ((${#skip[@]} > 0)); then
    echo "ctest leaves out (run or timed out above): ${skip[*]}"
    exclude=(-E "$(IFS='|'; echo "${skip[*]}")")
  fi
  (cd build-gpu && ctest -L gpu --output-on-failure "${exclude[@]}" 2>&1 |
    tee "$out/ctest_gpu.log" | tail -25)

  stamp python package and tests in the background
  scripts/gpu_python_check.sh >"$out/python_check.txt" 2>&1 &
  python_pid=$!

  stamp memcheck
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # The dist test's CLI case runs the whole `mxq moe` command: over 7 minutes under memcheck, so
  # only the layer's cases are sanitized.
  for spec in "test_moe_mxfp4_moe_op_gpu_test:*" "test_moe_moe_dist_gpu_test:MoeDistLayer.*" \
    "test_moe_moe_forward_gpu_test:*t4096*:*e32_tp2_ep2_t64*:*scale_spread*"; do
    t=${spec%%:*}
    bin=$(find build-gpu -name "$t" -type f | head -1)
    [[ -n "$bin" ]] || { echo "$t: not built"; continue; }
    timeout 300 "$sanitizer" --tool memcheck --error-exitcode 3 "$bin" \
      --gtest_filter="${spec#*:}" >"$out/memcheck_$t.log" 2>&1
    echo "$t memcheck rc=$? ($(grep -c 'ERROR SUMMARY: 0 errors' "$out/memcheck_$t.log") clean summaries)"
  done

  wait "$python_pid"
  echo "python check rc=$?"; tail -5 "$out/python_check.txt"

  # racecheck on the W4A8 wgmma GEMMs (shared-memory ring, TMA, named-barrier votes), one case;
  # last, since it is the slowest (its log comes back even if the call's time runs out).
  bin=$(find build-gpu -name test_moe_moe_forward_gpu_test -type f | head -1)
  timeout 240 "$sanitizer" --tool racecheck --error-exitcode 3 "$bin" \
    --gtest_filter='Shapes/MoeGpuW4a8VsCpu.*scale_spread*' >"$out/racecheck_w4a8.log" 2>&1
  echo "racecheck W4A8 rc=$?"

  # memcheck and racecheck on the linear tiles' cluster cases, every tactic: 64 x 2112 (an odd
  # tile count along N: multicast into the peer's shared memory), 37 x 528 x 1664 (split K over 2
  # and 4 blocks, a ragged last tile) and 2100 x 2112 (many tiles per cluster: the split-K
  # reduction's "done" barrier, which one tile a cluster never exercises).
  bin=$(find build-gpu -name test_linear_linear_gpu_test -type f | head -1)
  for tool in memcheck racecheck; do
    for case in 6 8 9; do
      timeout 150 "$sanitizer" --tool $tool --error-exitcode 3 "$bin" \
        --gtest_filter="Shapes/EveryCudaTactic.*/$case" >"$out/${tool}_linear_$case.log" 2>&1
      echo "$tool linear case $case rc=$?"
    done
  done
}

# 4.: the benches (the Python ones use the package that run_tests installed).
run_benches() {
  stamp bench linear
  build-gpu/mxq bench linear --m 1,8,16,32,64,128,256,512,1024,2048,4096 --json \
    >"$out/linear-deepseek-v3-$day-$card.json" 2>"$out/bench_linear.err"; echo "rc=$?"
  stamp bench moe
  build-gpu/mxq bench moe --preset gpt-oss-120b --tokens 1,8,64,128,256,512,1024,4096,16384 \
    --w4a8 --json \
    >"$out/moe-gpt-oss-120b-$day-$card.json" 2>"$out/bench_moe.err"; echo "rc=$?"
  stamp python benches
  python3 bench/moe_grouped_mm.py --json >"$out/moe-grouped-mm-$day-$card.json" 2>&1; echo "rc=$?"
  python3 bench/transformers_generate.py --json >"$out/transformers-generate-$day-$card.json" 2>&1
  echo "rc=$?"
  if [[ -d .peers/deepgemm ]]; then  # staged and carried as docs/DEVELOPING.md says
    stamp DeepGEMM
    (cd .peers/deepgemm && python3 setup.py build >"$out/deepgemm_build.log" 2>&1) &&
      python3 bench/linear_deepgemm.py --json \
        --deepgemm "$(ls -d "$PWD"/.peers/deepgemm/build/lib.* | head -1)" \
        >"$out/linear-deepgemm-$day-$card.json" 2>"$out/linear_deepgemm.err"
    echo "rc=$?"
  fi
}

case "$part" in
  tests) run_tests ;;
  benches)
    stamp build
    MXQ_SKIP_CPU_TESTS=1 MXQ_SKIP_GPU_TESTS=1 scripts/gpu_check.sh || exit 1
    run_benches
    ;;
  all) run_tests && run_benches ;;
  quick)
    # When little device time is left: the new kernels against the reference and the timings
    # that decide their dispatch, in one call of about 7 minutes.
    stamp build
    MXQ_SKIP_CPU_TESTS=1 MXQ_SKIP_GPU_TESTS=1 \
      MXQ_BUILD_TARGETS="mxq_cli test_linear_linear_gpu_test test_moe_moe_forward_gpu_test" \
      scripts/gpu_check.sh || exit 1
    run_smokes
    stamp bench linear
    build-gpu/mxq bench linear --m 1,8,32,64,128,256,512,4096 --json \
      >"$out/linear-deepseek-v3-$day-$card.json" 2>"$out/bench_linear.err"; echo "rc=$?"
    stamp bench moe
    build-gpu/mxq bench moe --preset gpt-oss-120b --tokens 1,8,64,512,4096,16384 --w4a8 --json \
      >"$out/moe-gpt-oss-120b-$day-$card.json" 2>"$out/bench_moe.err"; echo "rc=$?"
    ;;
esac
stamp done
