#!/usr/bin/env bash
# Builds the libFuzzer targets for mxq's file parsers (tests/fuzz/*_fuzz.cpp) with clang++-14,
# AddressSanitizer and UndefinedBehaviorSanitizer into build-fuzz/, then runs each for SECONDS
# (default 30). Exits non-zero when a target finds a crash; the input is in build-fuzz/artifacts/.
#
#   scripts/run_fuzzers.sh [SECONDS] [TARGET...]     e.g. scripts/run_fuzzers.sh 120 npy
#
# Independent of the CMake build: it compiles only src/io/*.cpp and src/core/*.cpp.
set -euo pipefail

seconds="${1:-30}"
shift || true
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${root}/build-fuzz"
cxx="${MXQ_FUZZ_CXX:-clang++-14}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for source in "${root}"/tests/fuzz/*_fuzz.cpp; do
    name="$(basename "${source}" .cpp)"
    targets+=("${name%_fuzz}")
  done
fi

command -v "${cxx}" >/dev/null || { echo "run_fuzzers: ${cxx} not found (apt-get install clang-14)" >&2; exit 2; }

# nlohmann/json: the system's, else the folder scripts/stage_deps.sh fills.
json_flags=()
if [ ! -f /usr/include/nlohmann/json.hpp ]; then
  if [ -f "${root}/.deps/include/nlohmann/json.hpp" ]; then
    json_flags=(-isystem "${root}/.deps/include")
  else
    echo "run_fuzzers: nlohmann/json.hpp not found (apt-get install nlohmann-json3-dev)" >&2
    exit 2
  fi
fi

# src/core/build_info.cpp includes the version header that CMake generates; a stub is enough.
mkdir -p "${out}/generated/mxq" "${out}/obj" "${out}/artifacts"
version="$(sed -n 's/^project(mxq VERSION \([0-9][0-9.]*\).*/\1/p' "${root}/CMakeLists.txt")"
cat >"${out}/generated/mxq/version.h" <<VERSION
// Stub written by scripts/run_fuzzers.sh (the CMake build generates the real one).
#pragma once
#define MXQ_VERSION "${version:-0.0.0}"
#define MXQ_VERSION_MAJOR 0
#define MXQ_VERSION_MINOR 0
#define MXQ_VERSION_PATCH 0
VERSION

flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined
       -fno-sanitize-recover=all -DMXQ_WITH_CUDA=0 -I"${root}/include" -I"${root}/src"
       -I"${out}/generated" "${json_flags[@]}")

echo "run_fuzzers: compiling the library sources with ${cxx}"
objects=()
pids=()
for source in "${root}"/src/io/*.cpp "${root}"/src/core/*.cpp; do
  relative="${source#"${root}"/src/}"
  object="${out}/obj/${relative//\//_}.o"
  objects+=("${object}")
  "${cxx}" "${flags[@]}" -fsanitize=fuzzer-no-link -c "${source}" -o "${object}" &
  pids+=($!)
  if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for pid in "${pids[@]}"; do wait "${pid}"; done

status=0
for target in "${targets[@]}"; do
  source="${root}/tests/fuzz/${target}_fuzz.cpp"
  [ -f "${source}" ] || { echo "run_fuzzers: no target ${source}" >&2; exit 2; }
  binary="${out}/${target}_fuzz"
  "${cxx}" "${flags[@]}" -fsanitize=fuzzer "${source}" "${objects[@]}" -lpthread -o "${binary}"
  # New inputs go to build-fuzz/corpus/<target>; the committed seeds are only read.
  corpus="${out}/corpus/${target}"
  mkdir -p "${corpus}"
  dict=()
  [ -f "${root}/tests/fuzz/${target}.dict" ] && dict=(-dict="${root}/tests/fuzz/${target}.dict")
  echo "run_fuzzers: running ${target} for ${seconds} s"
  if ! "${binary}" "${corpus}" "${root}/tests/fuzz/corpus/${target}" "${dict[@]}" \
      -max_total_time="${seconds}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="${out}/artifacts/${target}-" 2>"${out}/${target}.log"; then
    echo "run_fuzzers: ${target} FAILED; log: ${out}/${target}.log" >&2
    tail -n 60 "${out}/${target}.log" >&2
    status=1
  else
    grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)" \
      "${out}/${target}.log" | sed "s/^/  ${target} /"
  fi
done
exit "${status}"
