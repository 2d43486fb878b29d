#!/usr/bin/env bash
# The one-step Python install, as a user does it: a fresh virtual environment, `pip install
# ./python` (scikit-build-core compiles libmlakit_c.so from source into the wheel; CPU only
# unless MLAKIT_CUDA says otherwise), `import mlakit` from outside the checkout with no build
# tree involved, then the package's pytest suite against the installed wheel.
# MLAKIT_BUILD_DIR=<build tree>: package that build's library instead of compiling (CI does, to
# save the second compile of the library; the wheel is still installed and tested on its own).
# MLAKIT_CLI=<mlakit command>: also run the `mlakit bench` tests with that command (they skip
# without it); CI passes the release build's, so this one run covers the whole suite.
# Exit status: pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" -m venv "$WORK/venv"
VENV_PYTHON="$WORK/venv/bin/python"
PIP=("$VENV_PYTHON" -m pip install --quiet --disable-pip-version-check --no-warn-script-location)
"${PIP[@]}" numpy==2.4.6 ml_dtypes==0.7.0 pytest==9.2.0 matplotlib==3.10.8
# MLAKIT_CUDA defaults to OFF here (the CUDA backend has its own build step in scripts/test.sh).
MLAKIT_CUDA="${MLAKIT_CUDA:-OFF}" "${PIP[@]}" "$REPO/python"

cd "$WORK"  # nothing of the checkout on the path: the installed package only
env -u MLAKIT_LIBRARY "$VENV_PYTHON" -c \
  "import mlakit; print('installed', mlakit.library_path, mlakit.build_info())"
case "$("$VENV_PYTHON" -c 'import mlakit; print(mlakit.library_path)')" in
  "$WORK"/venv/*) ;;
  *) echo "test_python_wheel: mlakit loaded a library outside the wheel" >&2; exit 1 ;;
esac
exec env -u MLAKIT_LIBRARY "$VENV_PYTHON" -m pytest -q -p no:cacheprovider \
  "$REPO/python/tests"
