# Third-party libraries, all from Debian packages or the CUDA toolkit (see .ci/run).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
find_package(PNG REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)
find_package(PkgConfig REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# FFTW3 (double): the CPU PME of `kiln mdrun` (hpc/md/).
pkg_check_modules(FFTW3 REQUIRED IMPORTED_TARGET fftw3)
# io/: plots and image grids with text. Found directly (not through pkg-config, whose cairo.pc
# requires the -dev packages of all of cairo's dependencies) so a carried libcairo2-dev suffices.
find_path(CAIRO_INCLUDE_DIR cairo.h PATH_SUFFIXES cairo REQUIRED)
find_library(CAIRO_LIBRARY cairo REQUIRED)
add_library(Kiln::cairo INTERFACE IMPORTED)
target_include_directories(Kiln::cairo INTERFACE ${CAIRO_INCLUDE_DIR})
target_link_libraries(Kiln::cairo INTERFACE ${CAIRO_LIBRARY})
find_package(OpenSSL REQUIRED COMPONENTS Crypto)  # io/file_digest: MD5/SHA-1 of downloads

if(KILN_CUDA)
  # cuDNN and NCCL live beside the toolkit on Debian's CUDA packages and in the
  # Python wheels on the H200 machine; KILN_CUDNN_ROOT / KILN_NCCL_ROOT point at the latter.
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${KILN_CUDNN_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
  find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${KILN_CUDNN_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${KILN_NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${KILN_NCCL_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
endif()
