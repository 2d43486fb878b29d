#!/usr/bin/env bash
# Installs the build and test dependencies of mlakit on Debian 12 (idempotent; fast when present).
# Versions are pinned to Debian 12's; if the archive has moved on, the current version is taken
# and a warning says so.
set -euo pipefail

PACKAGES=(
  cmake=3.25.1-1
  ninja-build=1.11.1-2~deb12u1
  g++=4:12.2.0-3
  pkgconf=1.8.1-1
  # OpenBLAS's OpenMP build, the one mlakit can call from its own threads (FindOpenBLASOpenMP.cmake).
  libopenblas-openmp-dev=0.3.21+ds-4
  libopenblas0-openmp=0.3.21+ds-4
  libgtest-dev=1.12.1-0.2
  libgmock-dev=1.12.1-0.2
  libcli11-dev=2.1.2+ds-1
  nlohmann-json3-dev=3.11.2-2
  libopenmpi-dev=4.1.4-3+b1
  openmpi-bin=4.1.4-3+b1
  # libFuzzer targets (scripts/fuzz.sh): clang 14 with its sanitizer/fuzzer runtimes and OpenMP.
  clang-14=1:14.0.6-12
  libclang-rt-14-dev=1:14.0.6-12
  libomp-14-dev=1:14.0.6-12
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for spec in "${PACKAGES[@]}"; do
  name=${spec%%=*}
  if ! dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$spec")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "[bootstrap] installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
    echo "[bootstrap] warning: pinned versions unavailable; installing the archive's current ones"
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]%%=*}"
  fi
else
  echo "[bootstrap] dependencies present"
fi
