# `cmake --install`: the public headers, libmlakit.a (the C++ API; static because that API has no
# ABI promise across compilers and versions, docs/packaging.md), libmlakit_c.so (the stable C ABI),
# the `mlakit` command, and the CMake package mlakitConfig.cmake exporting mlakit::mlakit and
# mlakit::mlakit_c.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MLAKIT_CMAKE_INSTALL_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/mlakit")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/mlakit" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(TARGETS mlakit mlakit_c EXPORT mlakitTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
        LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
        RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}"
        INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
if(MLAKIT_BUILD_APPS)
  install(TARGETS mlakit_cli RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
endif()

install(EXPORT mlakitTargets NAMESPACE mlakit:: DESTINATION "${MLAKIT_CMAKE_INSTALL_DIR}")
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/mlakitConfig.cmake.in"
                              "${PROJECT_BINARY_DIR}/mlakitConfig.cmake"
                              INSTALL_DESTINATION "${MLAKIT_CMAKE_INSTALL_DIR}")
# 0.x: a minor version may break the API, so only the same major.minor is compatible.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/mlakitConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/mlakitConfig.cmake"
              "${PROJECT_BINARY_DIR}/mlakitConfigVersion.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/FindOpenBLASOpenMP.cmake"
        DESTINATION "${MLAKIT_CMAKE_INSTALL_DIR}")
if(MLAKIT_NCCL)
  # mlakit::mlakit links NCCL::nccl, which this module defines (NCCL ships no CMake package).
  install(FILES "${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake" DESTINATION "${MLAKIT_CMAKE_INSTALL_DIR}")
endif()
