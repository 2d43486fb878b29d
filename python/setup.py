"""Build hook of the mlakit Python package: puts the C library into the package.

`pip install ./python` copies libmlakit_c.so from the CMake build into mlakit/_lib/, taken from
  $MLAKIT_BUILD_DIR/src/capi/libmlakit_c.so   when MLAKIT_BUILD_DIR is set (it must exist), else
  <repo>/build/release/src/capi/libmlakit_c.so (the `cmake --preset release` build), if built.
Without either, the package installs without the library and finds it at import time through
$MLAKIT_LIBRARY or the dynamic loader (see mlakit/_library.py). The wheel carries a native
library, so it is tagged for this platform.
"""

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

LIBRARY = "libmlakit_c.so"
HERE = Path(__file__).resolve().parent


def find_library():
    build_dir = os.environ.get("MLAKIT_BUILD_DIR")
    if build_dir:
        path = Path(build_dir) / "src" / "capi" / LIBRARY
        if not path.is_file():
            raise SystemExit(f"mlakit: MLAKIT_BUILD_DIR is set but {path} does not exist")
        return path
    path = HERE.parent / "build" / "release" / "src" / "capi" / LIBRARY
    return path if path.is_file() else None


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        library = find_library()
        target = Path(self.build_lib) / "mlakit" / "_lib" / LIBRARY
        if library is None:
            target.unlink(missing_ok=True)  # no stale copy from an earlier build directory
            print("mlakit: warning: no libmlakit_c.so found (build it with `cmake --preset "
                  "release && cmake --build --preset release`, or set MLAKIT_BUILD_DIR); the "
                  "package will need MLAKIT_LIBRARY at run time")
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, target)  # follows the .so -> .so.0 -> .so.0.1.0 links
        print(f"mlakit: packaged {library}")


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
