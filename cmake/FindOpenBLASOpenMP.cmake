# FindOpenBLASOpenMP: OpenBLAS built with OpenMP (USE_OPENMP=1), the only one of its three builds
# that mlakit can call safely without a process-wide setting (docs/kernels/gemm_cpu.md, "Which
# OpenBLAS build"). mlakit runs one sgemm per tile on each of its own threads at once:
#   - the OpenMP build sizes a call's team by the calling thread's OpenMP thread count, a per-thread
#     setting that mlakit sets to 1 around its own calls (cpu/sgemm.cpp);
#   - the pthreads build (Debian's default libopenblas.so) has only a process-wide thread count;
#   - the serial build (no USE_LOCKING in Debian's) hands one packing buffer to two threads that
#     call it at once: wrong results.
# So whatever is found is linked into a probe that must report the OpenMP build
# (openblas_get_parallel() == 2); anything else stops the configure, naming what was found.
#
# Debian 12: libopenblas-openmp-dev (lib/<arch>/openblas-openmp/; scripts/bootstrap.sh). Elsewhere:
# OpenBLASOpenMP_ROOT, or OpenBLASOpenMP_LIBRARY and OpenBLASOpenMP_INCLUDE_DIR.
#
# Defines OpenBLASOpenMP::OpenBLASOpenMP (the shared library; cblas.h; GNU's OpenMP runtime, whose
# omp_* calls mlakit makes) and, with COMPONENTS static, OpenBLASOpenMP::static (the archive of the
# same directory, which libmlakit_c.so carries inside).
include(FindPackageHandleStandardArgs)

# PATH_SUFFIXES are searched before the plain directories, so Debian's variant directory wins over
# /usr/lib/<arch>/libopenblas.so, the alternatives link to the default (pthreads) build.
find_path(OpenBLASOpenMP_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-openmp)
find_library(OpenBLASOpenMP_LIBRARY NAMES openblas PATH_SUFFIXES openblas-openmp)
# libopenblas.so.0 of the OpenMP build needs libgomp; mlakit's own omp_* calls need it on the link
# line (a library's DT_NEEDED does not serve the program's references).
find_library(OpenBLASOpenMP_GOMP_LIBRARY NAMES gomp
             HINTS ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES} ${CMAKE_C_IMPLICIT_LINK_DIRECTORIES})

set(_openblas_openmp_build_ok FALSE)
if(OpenBLASOpenMP_LIBRARY AND OpenBLASOpenMP_INCLUDE_DIR AND OpenBLASOpenMP_GOMP_LIBRARY)
  get_filename_component(_openblas_openmp_dir "${OpenBLASOpenMP_LIBRARY}" DIRECTORY)
  if(NOT OpenBLASOpenMP_PROBED_LIBRARY STREQUAL OpenBLASOpenMP_LIBRARY)
    set(_probe_dir "${CMAKE_BINARY_DIR}/CMakeFiles/openblas_openmp_probe")
    file(WRITE "${_probe_dir}/probe.c"
         "#include <stdio.h>\n#include <cblas.h>\n"
         "int main(void) { printf(\"%d\", openblas_get_parallel()); return 0; }\n")
    # The rpath makes the probe load the library found, not the first libopenblas.so.0 on the
    # loader's path (Debian's three builds share that name).
    try_run(_probe_run _probe_compile "${_probe_dir}/build" "${_probe_dir}/probe.c"
            CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${OpenBLASOpenMP_INCLUDE_DIR}"
            LINK_OPTIONS "LINKER:-rpath,${_openblas_openmp_dir}"
            LINK_LIBRARIES "${OpenBLASOpenMP_LIBRARY}" "${OpenBLASOpenMP_GOMP_LIBRARY}"
            COMPILE_OUTPUT_VARIABLE _probe_compile_output
            RUN_OUTPUT_VARIABLE _probe_output)
    if(NOT _probe_compile)
      message(FATAL_ERROR "FindOpenBLASOpenMP: cannot link a program against "
                          "${OpenBLASOpenMP_LIBRARY}:\n${_probe_compile_output}")
    endif()
    # openblas_get_parallel(): 0 serial, 1 pthreads, 2 OpenMP.
    if(NOT _probe_output STREQUAL "2")
      set(_found_what "a build whose openblas_get_parallel() says '${_probe_output}'")
      if(_probe_output STREQUAL "0")
        set(_found_what "the serial build (it is not safe to call from several threads at once)")
      elseif(_probe_output STREQUAL "1")
        set(_found_what "the pthreads build (its thread count is process-wide)")
      endif()
      message(FATAL_ERROR
              "FindOpenBLASOpenMP: ${OpenBLASOpenMP_LIBRARY} is ${_found_what}; mlakit needs "
              "OpenBLAS built with OpenMP (docs/kernels/gemm_cpu.md). Debian 12: apt-get install "
              "libopenblas-openmp-dev (scripts/bootstrap.sh); elsewhere set OpenBLASOpenMP_ROOT or "
              "OpenBLASOpenMP_LIBRARY and OpenBLASOpenMP_INCLUDE_DIR.")
    endif()
    set(OpenBLASOpenMP_PROBED_LIBRARY "${OpenBLASOpenMP_LIBRARY}"
        CACHE INTERNAL "The OpenBLAS library the probe found to be the OpenMP build")
  endif()
  set(_openblas_openmp_build_ok TRUE)
  find_library(OpenBLASOpenMP_STATIC_LIBRARY NAMES libopenblas.a
               HINTS "${_openblas_openmp_dir}" NO_DEFAULT_PATH)
  if(OpenBLASOpenMP_STATIC_LIBRARY)
    set(OpenBLASOpenMP_static_FOUND TRUE)
  endif()
endif()

find_package_handle_standard_args(OpenBLASOpenMP
  REQUIRED_VARS OpenBLASOpenMP_LIBRARY OpenBLASOpenMP_INCLUDE_DIR OpenBLASOpenMP_GOMP_LIBRARY
                _openblas_openmp_build_ok
  HANDLE_COMPONENTS)

if(OpenBLASOpenMP_FOUND AND NOT TARGET OpenBLASOpenMP::OpenBLASOpenMP)
  add_library(OpenBLASOpenMP::OpenBLASOpenMP SHARED IMPORTED)
  set_target_properties(OpenBLASOpenMP::OpenBLASOpenMP PROPERTIES
    IMPORTED_LOCATION "${OpenBLASOpenMP_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${OpenBLASOpenMP_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${OpenBLASOpenMP_GOMP_LIBRARY}")
  if(OpenBLASOpenMP_static_FOUND)
    add_library(OpenBLASOpenMP::static STATIC IMPORTED)
    set_target_properties(OpenBLASOpenMP::static PROPERTIES
      IMPORTED_LOCATION "${OpenBLASOpenMP_STATIC_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${OpenBLASOpenMP_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${OpenBLASOpenMP_GOMP_LIBRARY}")
  endif()
endif()
mark_as_advanced(OpenBLASOpenMP_INCLUDE_DIR OpenBLASOpenMP_LIBRARY OpenBLASOpenMP_GOMP_LIBRARY
                 OpenBLASOpenMP_STATIC_LIBRARY)
