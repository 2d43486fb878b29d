#!/usr/bin/env bash
# Tests of the Python package: installs the pinned test dependencies and the package (packaging
# libmlakit_c.so of build/release, no compile: MLAKIT_BUILD_DIR, see python/pyproject.toml), then
# runs pytest on python/tests.
# Needs the release build first: cmake --preset release && cmake --build --preset release
# (MLAKIT_BUILD_DIR names another build directory).
# torch tests skip where torch is not installed; matplotlib is for `mlakit bench --plot`. Exit status: pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUILD_DIR=${MLAKIT_BUILD_DIR:-$PWD/build/release}
LIBRARY=$BUILD_DIR/src/capi/libmlakit_c.so

if [ ! -f "$LIBRARY" ]; then
  echo "test_python: $LIBRARY is missing;" \
    "run cmake --preset release && cmake --build --preset release" >&2
  exit 1
fi

PIP=("$PYTHON" -m pip install --quiet --disable-pip-version-check --no-warn-script-location
     --root-user-action=ignore)
"${PIP[@]}" numpy==2.4.6 ml_dtypes==0.7.0 pytest==9.2.0 matplotlib==3.10.8
# --force-reinstall: the version stays 0.1.0 while the library it packages changes.
MLAKIT_BUILD_DIR="$BUILD_DIR" "${PIP[@]}" --force-reinstall --no-deps ./python

# From the repository root `import mlakit` finds the installed package (python/ is not on the path).
unset MLAKIT_LIBRARY
# The `mlakit bench` tests run the command of the same build.
export MLAKIT_CLI="$BUILD_DIR/apps/mlakit/mlakit"
exec "$PYTHON" -m pytest -q -p no:cacheprovider python/tests
