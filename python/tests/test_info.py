"""Version, build description and library loading."""

import os
import subprocess
import sys

import mlakit


def test_version_matches_the_library():
    assert mlakit.version() == mlakit.__version__


def test_build_info_describes_the_build():
    info = mlakit.build_info()
    assert info["version"] == mlakit.version()
    assert info["abi"] == 4
    assert isinstance(info["cuda"], bool)
    assert info["blas"] == "openblas-openmp"
    assert info["threads"] >= 1


def test_library_path_is_a_file():
    assert os.path.isfile(mlakit.library_path)


def test_missing_library_named_by_mlakit_library_is_an_import_error(tmp_path):
    missing = tmp_path / "libmlakit_c.so"
    env = dict(os.environ, MLAKIT_LIBRARY=str(missing))
    result = subprocess.run([sys.executable, "-c", "import mlakit"], env=env,
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert f"MLAKIT_LIBRARY: {missing} does not exist" in result.stderr


def test_mlakit_library_selects_the_file():
    env = dict(os.environ, MLAKIT_LIBRARY=mlakit.library_path, MLAKIT_DISABLE_TORCH="1")
    code = "import mlakit; print(mlakit.library_path)"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == mlakit.library_path
