# `pip install ./python` (scikit-build-core, python/pyproject.toml): the wheel's one native file,
# mlakit/_lib/libmlakit_c.so (where mlakit/_library.py looks first). A single file, not the
# versioned .so chain: wheels cannot hold symbolic links.
if(MLAKIT_PYTHON_PREBUILT_DIR)
  # No compile: the library of an existing build tree (MLAKIT_BUILD_DIR, e.g. build/release).
  set(_mlakit_prebuilt "${MLAKIT_PYTHON_PREBUILT_DIR}/src/capi/libmlakit_c.so")
  if(NOT EXISTS "${_mlakit_prebuilt}")
    message(FATAL_ERROR "MLAKIT_BUILD_DIR is set but ${_mlakit_prebuilt} does not exist")
  endif()
  file(REAL_PATH "${_mlakit_prebuilt}" _mlakit_prebuilt)
  install(FILES "${_mlakit_prebuilt}" DESTINATION mlakit/_lib RENAME libmlakit_c.so)
else()
  install(FILES $<TARGET_FILE:mlakit_c> DESTINATION mlakit/_lib RENAME libmlakit_c.so)
endif()
