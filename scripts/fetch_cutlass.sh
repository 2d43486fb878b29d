#!/usr/bin/env bash
# Puts the CUTLASS / CuTe headers (used by the sm90 wgmma kernels) in .deps/cutlass/include:
# the PyPI wheel nvidia-cutlass, pinned by version and sha256, unpacked without installing it.
# Idempotent; only the CUDA build needs it.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=4.2.0.0
SHA256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
DEST=.deps/cutlass
STAMP="$DEST/VERSION"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$VERSION" ]; then
  echo "[cutlass] headers $VERSION present"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "[cutlass] downloading nvidia-cutlass==$VERSION"
python3 -m pip download --quiet --no-deps --only-binary=:all: "nvidia-cutlass==$VERSION" -d "$tmp"
wheel=$(ls "$tmp"/nvidia_cutlass-"$VERSION"-*.whl)
echo "$SHA256  $wheel" | sha256sum --check --quiet

rm -rf "$DEST"
mkdir -p "$DEST"
python3 - "$wheel" "$DEST" <<'PY'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = dest + "/include/" + name[len(prefix):]

            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(z.read(name))
        elif name.endswith("licenses/LICENSE.txt"):
            with open(dest + "/LICENSE.txt", "wb") as f:
                f.write(z.read(name))
PY
echo "$VERSION" > "$STAMP"
echo "[cutlass] headers $VERSION in $DEST/include"
