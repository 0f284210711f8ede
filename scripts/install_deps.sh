#!/usr/bin/env bash
# Installs what mxq needs to build and test on Debian 12, from Debian's apt only.
# Packages already present are skipped, so a second run costs nothing. The CUDA toolkit is not
# a Debian 12 package in the version mxq needs: when nvcc is on PATH (or /usr/local/cuda/bin)
# the CUDA kernels are built, otherwise the CPU library, CLI and tests are.
set -euo pipefail

packages=(
  build-essential cmake ninja-build git
  googletest libbenchmark-dev nlohmann-json3-dev libcli11-dev  # C++ dependencies
  clang clang-format clang-tidy libclang-rt-14-dev             # lint + libFuzzer
  python3 python3-dev python3-venv                              # the Python package
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  echo "install_deps: all packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
