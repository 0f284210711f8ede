#!/usr/bin/env bash
# Style and static checks, as CI runs them: clang-format (no diff allowed) and clang-tidy
# (.clang-tidy; warnings are errors) over the C++ sources. Needs a configured build folder for
# compile_commands.json (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build}"

mapfile -t sources < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' '*.hpp')
echo "lint: clang-format on ${#sources[@]} files"
clang-format --dry-run -Werror "${sources[@]}"

if [[ ! -f "$build_dir/compile_commands.json" ]]; then
  echo "lint: $build_dir/compile_commands.json missing: configure the build first" >&2
  exit 2
fi
mapfile -t tidy_sources < <(git ls-files 'src/*.cpp' 'tools/*.cpp')
echo "lint: clang-tidy on ${#tidy_sources[@]} files"
# run-clang-tidy parallelizes over the cores and exits non-zero on any finding.
log="$build_dir/clang-tidy.log"
if ! run-clang-tidy -quiet -p "$build_dir" -j "$(nproc)" "${tidy_sources[@]}" >"$log" 2>&1; then
  grep -v -E '^(Running clang-tidy|clang-tidy-14 |[0-9]+ warnings? generated|Suppressed [0-9]+ warnings|Use -header-filter)' "$log" >&2
  echo "lint: clang-tidy found problems (above; full log in $log)" >&2
  exit 1
fi
echo "lint: ok"
