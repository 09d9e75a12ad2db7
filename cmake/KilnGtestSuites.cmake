# One CTest test per GoogleTest suite (not per test): each test process pays the shared libraries'
# start-up (about 0.5 s of CPU: libcublasLt's initialisers with the CUDA backend, ASan's shadow
# memory under the sanitizers), and most tests take milliseconds, so a process per test cost CI
# more than the tests. Each suite's process writes GoogleTest's XML report to <build>/gtest-xml/,
# from which tools/test_summary.py counts and names every test, skips with their reasons.
#   kiln_add_gtest_suites(<target> PREFIX <name> LABELS <label>...)   (CTest names: <name>.<suite>)
# The suites are listed after each build of <target> (as gtest_discover_tests does) into a file
# CTest includes. `ctest -R layer.Suite` runs a suite; `<binary> --gtest_filter=Suite.Test` one test.
set(_KILN_GTEST_SUITES_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/KilnGtestSuitesList.cmake)

function(kiln_add_gtest_suites target)
  cmake_parse_arguments(ARG "" "PREFIX" "LABELS" ${ARGN})
  set(_ctest_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake)
  add_custom_command(
    TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -D TEST_EXECUTABLE=$<TARGET_FILE:${target}> -D CTEST_FILE=${_ctest_file}
            -D XML_DIR=${PROJECT_BINARY_DIR}/gtest-xml -D PREFIX=${ARG_PREFIX} -D "LABELS=${ARG_LABELS}" -P ${_KILN_GTEST_SUITES_SCRIPT}
    BYPRODUCTS ${_ctest_file}
    VERBATIM)
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_ctest_file})
endfunction()
