# `cmake --install` gives an outside project find_package(Kiln) with the Kiln::kiln target.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set_target_properties(kiln PROPERTIES INSTALL_RPATH "$ORIGIN")
install(TARGETS kiln EXPORT KilnTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kiln_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/kiln DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
install(FILES ${PROJECT_BINARY_DIR}/generated/kiln/build_info.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln)
install(EXPORT KilnTargets NAMESPACE Kiln:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Kiln)
if(KILN_CUDA)
  set(KILN_CUDA_ARCHITECTURES_EXPORT "${CMAKE_CUDA_ARCHITECTURES}")
  set(KILN_CUDA_COMPILER_EXPORT "${CMAKE_CUDA_COMPILER}")
else()
  set(KILN_CUDA_ARCHITECTURES_EXPORT "")
  set(KILN_CUDA_COMPILER_EXPORT "")
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/KilnConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/KilnConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Kiln)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/KilnConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/KilnConfig.cmake ${PROJECT_BINARY_DIR}/KilnConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/KilnExtension.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Kiln)
