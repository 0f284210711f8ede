#!/usr/bin/env bash
# An A/B of builds of mxq on the GPU machine: main against one or more patched trees (a kernel
# change written while no GPU was lent, kept as a patch in docs/perf-log/data/), built side by
# side, checked, and timed in interleaved rounds in the same device call.
#
#   here:   scripts/gpu_ab.sh stage NAME=SOURCE ...
#   there:  scripts/gpu_ab.sh build [TARGET ...]
#           scripts/gpu_ab.sh run NAME -- COMMAND ...
#           scripts/gpu_ab.sh bench ROUNDS -- MXQ_ARGS ...
#
# See `scripts/gpu_ab.sh --help` and docs/DEVELOPING.md ("An A/B of kernel changes").
set -euo pipefail
cd "$(dirname "$0")/.."
ab=.ab  # the staged sources, ignored by git; carry it (with .deps) to the GPU machine
# The unpacked trees and their builds, ignored too (/build*/). Not carried: a later call on the
# same warm machine finds them there and builds incrementally, even when it carries .ab again.
trees=build-ab

usage() {
  cat <<'EOF'
usage: scripts/gpu_ab.sh COMMAND ...

Here (the development machine, a git checkout):
  stage NAME=SOURCE ...   Writes .ab/NAME.tar.gz for each build, replacing what .ab held.
                          SOURCE is REV (a commit: main, HEAD, 91036a0), REV+PATCH[+PATCH...]
                          (the commit with patch files applied in order), or `worktree` (the
                          tracked and untracked, not ignored, files of this checkout as they are).
                          The first build is the baseline. Then carry [".deps", ".ab"].
There (the GPU machine, in the carried copy of the tree):
  build [TARGET ...]      Unpacks each staged build into build-ab/NAME/ and builds it in parallel
                          with scripts/gpu_check.sh (no tests): the targets given, default mxq_cli
                          and test_linear_linear_gpu_test. Logs in $OUT/ab/NAME/.
  run NAME -- COMMAND ... Runs COMMAND in build NAME's tree (build-ab/NAME), e.g.
                          `run p1 -- build-gpu/tests/test_linear_linear_gpu_test`.
  bench ROUNDS -- ARGS    ROUNDS interleaved rounds of `build-gpu/mxq ARGS` in every build (the
                          builds in order, then in reverse order the next round, ...), each
                          output in $OUT/ab/NAME.ROUND.json. For `bench linear ... --json` the
                          comparison of scripts/linear_ab.py follows, in $OUT/ab/summary.txt.
EOF
}

die() {
  echo "gpu_ab.sh: $*" >&2
  exit 2
}

realpath_of() { (cd "$(dirname "$1")" && echo "$PWD/$(basename "$1")"); }

valid_name() { [[ "$1" =~ ^[A-Za-z][A-Za-z0-9_-]*$ ]]; }

# The builds staged in .ab, in the order they were staged (the first is the baseline).
staged_names() {
  [[ -f "$ab/builds" ]] || die "nothing staged: run \`scripts/gpu_ab.sh stage NAME=SOURCE ...\` here, then carry .ab"
  cat "$ab/builds"
}

stage() {
  (($# >= 1)) || die "stage: give at least one NAME=SOURCE"
  git rev-parse --git-dir >/dev/null 2>&1 || die "stage runs in a git checkout"
  local spec name source names=() tmp
  local -A patch_lists=()  # NAME: its patches' absolute paths, one a line
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT  # also when a check below exits
  # Check every spec before writing anything.
  for spec in "$@"; do
    [[ "$spec" == *=* ]] || die "stage: '$spec' is not NAME=SOURCE"
    name=${spec%%=*}
    source=${spec#*=}
    valid_name "$name" || die "stage: build name '$name' must be a letter then letters, digits, _ or -"
    [[ " ${names[*]} " != *" $name "* ]] || die "stage: build name '$name' given twice"
    names+=("$name")
    if [[ "$source" != worktree ]]; then
      local rev=${source%%+*}
      git rev-parse --verify --quiet "$rev^{commit}" >/dev/null || die "stage: '$rev' (in $spec) is not a commit"
      if [[ "$source" == *+* ]]; then
        local patch patches
        IFS='+' read -r -a patches <<<"${source#*+}"
        for patch in "${patches[@]}"; do
          [[ -f "$patch" ]] || die "stage: patch '$patch' (in $spec) is not a file"
          patch_lists[$name]+="$(realpath_of "$patch")"$'\n'
        done
      fi
    fi
  done
  for spec in "$@"; do
    name=${spec%%=*}
    source=${spec#*=}
    local tree="$tmp/$name"
    mkdir -p "$tree"
    if [[ "$source" == worktree ]]; then
      git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done |
        tar -c --null -T - | tar -x -C "$tree"
    else
      git archive "${source%%+*}" | tar -x -C "$tree"
      local patch_path
      while IFS= read -r patch_path; do
        [[ -n "$patch_path" ]] || continue
        (cd "$tree" && git apply -p1 "$patch_path") ||
          die "stage: $patch_path does not apply to ${source%%+*} (build $name)"
      done <<<"${patch_lists[$name]:-}"
    fi
    tar -czf "$tmp/$name.tar.gz" -C "$tree" .
    echo "staged $name ($source): $(du -h "$tmp/$name.tar.gz" | cut -f1)"
  done
  rm -rf "$ab"
  mkdir -p "$ab"
  for name in "${names[@]}"; do mv "$tmp/$name.tar.gz" "$ab/"; done
  printf '%s\n' "${names[@]}" >"$ab/builds"
  rm -rf "$tmp"
  trap - EXIT
  echo "carry [\".deps\", \".ab\"]; there: scripts/gpu_ab.sh build, then run / bench"
}

build() {
  local targets=("$@") name pids=() failed=0
  ((${#targets[@]} > 0)) || targets=(mxq_cli test_linear_linear_gpu_test)
  [[ -d .deps ]] || die "build: no .deps here (scripts/stage_deps.sh, then carry .deps)"
  local out="${OUT:-/tmp/mxq-out}/ab"
  mkdir -p "$out"
  # The cores shared among the builds (nvcc of one kernel file takes GBs: all builds at every
  # core's worth of jobs could run the machine out of memory).
  local builds jobs
  builds=$(staged_names | wc -l)
  jobs=$(((($(nproc) + builds - 1) / builds) > 2 ? ($(nproc) + builds - 1) / builds : 2))
  for name in $(staged_names); do
    # A tree unpacked from the same staged sources (a second call on the same warm machine) is
    # built incrementally; other sources replace it.
    if ! cmp -s "$ab/$name.tar.gz" "$trees/$name.tar.gz"; then
      rm -rf "${trees:?}/$name"
      mkdir -p "$trees/$name"
      tar -xzf "$ab/$name.tar.gz" -C "$trees/$name"
      cp "$ab/$name.tar.gz" "$trees/$name.tar.gz"
    fi
    rm -rf "$trees/$name/.deps"
    cp -r .deps "$trees/$name/.deps"
    (cd "$trees/$name" && OUT="$out/$name" MXQ_BUILD_JOBS=$jobs MXQ_SKIP_GPU_TESTS=1 MXQ_SKIP_CPU_TESTS=1 \
      MXQ_BUILD_TARGETS="${targets[*]}" scripts/gpu_check.sh >"$out/$name.log" 2>&1) &
    pids+=($!)
  done
  local i=0
  for name in $(staged_names); do
    if wait "${pids[$i]}"; then
      echo "built $name"
    else
      echo "build of $name failed: $out/$name.log, $out/$name/build.log" >&2
      tail -5 "$out/$name.log" >&2
      failed=1
    fi
    i=$((i + 1))
  done
  return $failed
}

run_in() {
  (($# >= 3)) && [[ "$2" == -- ]] || die "run: give NAME -- COMMAND ..."
  local name=$1
  shift 2
  staged_names | grep -qx "$name" || die "run: no build named '$name' (staged: $(staged_names | tr '\n' ' '))"
  [[ -d "$trees/$name" ]] || die "run: build $name is not unpacked yet (scripts/gpu_ab.sh build)"
  (cd "$trees/$name" && "$@")
}

bench() {
  (($# >= 3)) && [[ "$2" == -- ]] || die "bench: give ROUNDS -- MXQ_ARGS ..."
  local rounds=$1
  shift 2
  [[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "bench: ROUNDS must be a positive integer, not '$rounds'"
  local out="${OUT:-/tmp/mxq-out}/ab" names=() name r
  mkdir -p "$out"
  mapfile -t names < <(staged_names)
  for name in "${names[@]}"; do
    [[ -x "$trees/$name/build-gpu/mxq" ]] || die "bench: $trees/$name/build-gpu/mxq is not built (scripts/gpu_ab.sh build)"
  done
  for ((r = 1; r <= rounds; r++)); do
    local order=("${names[@]}")
    if ((r % 2 == 0)); then
      order=()
      for ((i = ${#names[@]} - 1; i >= 0; i--)); do order+=("${names[$i]}"); done
    fi
    for name in "${order[@]}"; do
      local start=$SECONDS
      if ! (cd "$trees/$name" && build-gpu/mxq "$@") >"$out/$name.$r.json" 2>"$out/$name.$r.err"; then
        echo "round $r, $name: mxq failed (see $out/$name.$r.err)" >&2
        tail -3 "$out/$name.$r.err" >&2
        return 1
      fi
      echo "round $r, $name: $((SECONDS - start)) s"
    done
  done
  if [[ "${1:-}" == bench && "${2:-}" == linear && " $* " == *" --json "* ]]; then
    local builds=()
    for name in "${names[@]}"; do
      local runs=()
      for ((r = 1; r <= rounds; r++)); do runs+=("$out/$name.$r.json"); done
      builds+=(--build "$name=$(
        IFS=,
        echo "${runs[*]}"
      )")
    done
    python3 scripts/linear_ab.py "${builds[@]}" | tee "$out/summary.txt"
  fi
}

case "${1:-}" in
  -h | --help | help) usage ;;
  stage) shift && stage "$@" ;;
  build) shift && build "$@" ;;
  run) shift && run_in "$@" ;;
  bench) shift && bench "$@" ;;
  "") usage >&2 && exit 2 ;;
  *) die "unknown command '$1' (stage, build, run, bench; --help)" ;;
esac
