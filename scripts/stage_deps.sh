#!/usr/bin/env bash
# Stages mxq's C++ dependencies from this machine's Debian packages into a folder (default
# .deps, ignored by git) so that a machine without those -dev packages (the offline GPU machine)
# can build mxq: CMake looks there first (MXQ_DEPS_DIR). Header-only libraries are copied as
# headers; GoogleTest as the source Debian ships (it is compiled as part of the build).
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.deps}"
scripts/install_deps.sh >/dev/null
rm -rf "$dest"
mkdir -p "$dest/include" "$dest/src"
cp -r /usr/include/nlohmann "$dest/include/"
cp -r /usr/include/CLI "$dest/include/"
cp -r /usr/src/googletest "$dest/src/googletest"
du -sh "$dest" | awk '{print "stage_deps: staged " $1 " into '"$dest"'"}'
