# Layers (src/kiln/<layer>/) contribute sources to one shared library `kiln`, so that the op
# registry, backend registry and allocator exist once per process, for the CLI, the tests and
# extensions loaded at run time alike. A layer's CUDA sources are only compiled with KILN_CUDA.
define_property(GLOBAL PROPERTY KILN_SOURCES BRIEF_DOCS "kiln sources" FULL_DOCS "kiln sources")
define_property(GLOBAL PROPERTY KILN_CUDA_SOURCES BRIEF_DOCS "kiln CUDA sources" FULL_DOCS "kiln CUDA sources")

# kiln_layer_sources(<files...> [CUDA <files...>])
function(kiln_layer_sources)
  cmake_parse_arguments(ARG "" "" "CUDA" ${ARGN})
  foreach(_f IN LISTS ARG_UNPARSED_ARGUMENTS)
    get_filename_component(_abs ${_f} ABSOLUTE)
    set_property(GLOBAL APPEND PROPERTY KILN_SOURCES ${_abs})
  endforeach()
  if(KILN_CUDA)
    foreach(_f IN LISTS ARG_CUDA)
      get_filename_component(_abs ${_f} ABSOLUTE)
      set_property(GLOBAL APPEND PROPERTY KILN_CUDA_SOURCES ${_abs})
    endforeach()
  endif()
endfunction()

set(KILN_WARNINGS -Wall -Wextra -Wpedantic -Werror -Wno-unused-parameter)

function(kiln_finalize_library)
  get_property(_srcs GLOBAL PROPERTY KILN_SOURCES)
  get_property(_cuda GLOBAL PROPERTY KILN_CUDA_SOURCES)
  add_library(kiln SHARED ${_srcs} ${_cuda})
  add_library(Kiln::kiln ALIAS kiln)
  # The C++ files compile in batches of 8 (see KILN_UNITY_BUILD); CUDA files one by one.
  set_target_properties(kiln PROPERTIES UNITY_BUILD ${KILN_UNITY_BUILD} UNITY_BUILD_BATCH_SIZE 8)
  # CMake 3.28+ would batch CUDA files too: their kernels' file-local constants share names.
  if(_cuda)
    set_source_files_properties(${_cuda} TARGET_DIRECTORY kiln PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
  target_include_directories(kiln PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>
                                         $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>
                                         $<INSTALL_INTERFACE:include>)
  target_compile_options(kiln PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KILN_WARNINGS}>
                                      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra,-Werror,-Wno-unused-parameter>
                                      # nvcc cannot evaluate fmt's consteval format-string checks.
                                      $<$<COMPILE_LANGUAGE:CUDA>:-DFMT_CONSTEVAL= -DFMT_USE_CONSTEXPR=1>)
  target_compile_features(kiln PUBLIC cxx_std_20)
  # The C API only: the deprecated MPI C++ bindings would need libmpi_cxx.
  target_compile_definitions(kiln PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  target_link_libraries(kiln PUBLIC fmt::fmt Threads::Threads
                             PRIVATE nlohmann_json::nlohmann_json PkgConfig::OPENBLAS PkgConfig::PCRE2 PkgConfig::FFTW3
                                     PNG::PNG MPI::MPI_C ${CMAKE_DL_LIBS} Kiln::cairo OpenSSL::Crypto)
  if(KILN_CUDA)
    target_compile_definitions(kiln PUBLIC KILN_WITH_CUDA=1)
    target_include_directories(kiln PRIVATE ${CUDNN_INCLUDE_DIR} ${NCCL_INCLUDE_DIR})
    target_link_libraries(kiln PRIVATE CUDA::cudart CUDA::cublas CUDA::cublasLt CUDA::cusparse
                                       CUDA::cusolver CUDA::cufft ${CUDNN_LIBRARY} ${NCCL_LIBRARY})
    set_target_properties(kiln PROPERTIES CUDA_SEPARABLE_COMPILATION OFF CUDA_RUNTIME_LIBRARY Shared)
  else()
    target_compile_definitions(kiln PUBLIC KILN_WITH_CUDA=0)
  endif()
  if(KILN_SANITIZE)
    # The CPU compute kernels at -O1 under the sanitizers (the rest stays at the Debug build's -O0):
    # at -O0 their inner loops made the training tests 5-6x slower than in Release (train.Rewind
    # 382 s against 62 s), most of CI's sanitizer time, while -O1 is what AddressSanitizer's own
    # documentation recommends and keeps every check. Only these files: -O1 costs each file about
    # twice the compile time of -O0.
    file(GLOB _kiln_cpu_kernels ${PROJECT_SOURCE_DIR}/src/kiln/*/cpu/*.cpp ${PROJECT_SOURCE_DIR}/src/kiln/*/*/cpu_*.cpp
         ${PROJECT_SOURCE_DIR}/src/kiln/hpc/md/nonbonded.cpp ${PROJECT_SOURCE_DIR}/src/kiln/hpc/md/pme.cpp
         ${PROJECT_SOURCE_DIR}/src/kiln/hpc/md/pme_kernels.cpp)
    set_source_files_properties(${_kiln_cpu_kernels} TARGET_DIRECTORY kiln PROPERTIES COMPILE_OPTIONS -O1)
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/build_info.h.in ${PROJECT_BINARY_DIR}/generated/kiln/build_info.h @ONLY)
endfunction()
