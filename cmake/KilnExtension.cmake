# kiln_add_extension: builds a custom-op extension, a shared library that links Kiln::kiln and
# registers ops through `extern "C" void kiln_extension_init(kiln::OpRegistry&)` (docs/extensions.md).
#
#   kiln_add_extension(<name>
#     SOURCES <files...>            .cpp/.cc/.cxx: host compiler; .cu: CUDA compiler (nvcc);
#                                   .mu: MUSA compiler (mcc); .h/.hpp/.cuh: headers (not compiled)
#     [CXX_FLAGS <flags...>]        for the host-compiled sources only
#     [DEVICE_FLAGS <flags...>]     for the device-compiled sources only (.cu, .mu, and the host
#                                   sources under FORCE_DEVICE_COMPILER)
#     [FORCE_DEVICE_COMPILER]       compile the .cpp/.cc/.cxx sources as device code too
#                                   (CUDA, or MUSA when the extension has .mu sources)
#     [MODULE]                      a MODULE library (dlopen only); default SHARED (dlopen or link)
#     [OUTPUT_NAME <name>])
#
# Installed with Kiln and included by KilnConfig.cmake; Kiln's own tests include it in-tree.
# A macro, so that enable_language(CUDA) runs in the caller's directory scope as CMake requires.
include_guard(GLOBAL)
include(CheckLanguage)

macro(kiln_add_extension _kiln_ext_name)
  set(_kiln_ext_argv ${ARGN})
  _kiln_extension_languages(${_kiln_ext_name} _kiln_ext_needs_cuda ${_kiln_ext_argv})
  get_property(_kiln_ext_languages GLOBAL PROPERTY ENABLED_LANGUAGES)
  if(_kiln_ext_needs_cuda AND NOT "CUDA" IN_LIST _kiln_ext_languages)
    _kiln_extension_find_cuda(${_kiln_ext_name} "${_kiln_ext_needs_cuda}")
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND KILN_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${KILN_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
  endif()
  if(_kiln_ext_needs_cuda AND NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    # CMake < 3.26 does not know nvcc's C++20 flag (nvcc >= 12 has it). Read at generate time
    # from this directory's scope, which is why this is a macro.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD_COMPUTED_DEFAULT 17)
  endif()
  _kiln_add_extension_target(${_kiln_ext_name} ${_kiln_ext_argv})
  unset(_kiln_ext_argv)
  unset(_kiln_ext_needs_cuda)
  unset(_kiln_ext_languages)
endmacro()

# The keywords, as a macro rather than variables: include_guard(GLOBAL) skips this file in a
# second directory that finds Kiln, where variables set here would not be visible.
macro(_kiln_extension_parse first)
  cmake_parse_arguments(PARSE_ARGV ${first} ARG "FORCE_DEVICE_COMPILER;MODULE;SHARED" "OUTPUT_NAME"
                        "SOURCES;CXX_FLAGS;DEVICE_FLAGS")
endmacro()

# Sorts SOURCES into host / CUDA / MUSA / header lists (in the caller's scope, prefixed <prefix>_);
# a source of any other kind is a configure-time error that names it.
function(_kiln_extension_classify name prefix)
  set(_host "")
  set(_cuda "")
  set(_musa "")
  set(_headers "")
  foreach(_src IN LISTS ARGN)
    get_filename_component(_ext "${_src}" LAST_EXT)
    string(TOLOWER "${_ext}" _ext)
    if(_ext MATCHES "^\\.(cpp|cc|cxx|c\\+\\+)$")
      list(APPEND _host "${_src}")
    elseif(_ext STREQUAL ".cu")
      list(APPEND _cuda "${_src}")
    elseif(_ext STREQUAL ".mu")
      list(APPEND _musa "${_src}")
    elseif(_ext MATCHES "^\\.(h|hh|hpp|hxx|cuh|muh|inc)$")
      list(APPEND _headers "${_src}")
    else()
      if(_ext STREQUAL "")
        set(_what "it has no file extension")
      else()
        set(_what "'${_ext}' is not a known kind of source")
      endif()
      message(FATAL_ERROR
        "kiln_add_extension(${name}): cannot compile '${_src}': ${_what}. Use .cpp/.cc/.cxx for host "
        "code (host compiler), .cu for CUDA (nvcc), .mu for MUSA (mcc), .h/.hpp/.cuh for headers.")
    endif()
  endforeach()
  set(${prefix}_host "${_host}" PARENT_SCOPE)
  set(${prefix}_cuda "${_cuda}" PARENT_SCOPE)
  set(${prefix}_musa "${_musa}" PARENT_SCOPE)
  set(${prefix}_headers "${_headers}" PARENT_SCOPE)
endfunction()

# Checks the arguments and sets <out> to the sources that need a CUDA compiler (empty when none do).
function(_kiln_extension_languages name out)
  _kiln_extension_parse(2)
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kiln_add_extension(${name}): unknown arguments ${ARG_UNPARSED_ARGUMENTS} "
                        "(expected SOURCES, CXX_FLAGS, DEVICE_FLAGS, FORCE_DEVICE_COMPILER, MODULE, OUTPUT_NAME)")
  endif()
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "kiln_add_extension(${name}): no SOURCES given")
  endif()
  _kiln_extension_classify(${name} _src ${ARG_SOURCES})
  # Which compiler a source goes to is a property of the source in its directory, not of the
  # target: the same host source cannot be forced to the device compiler in one extension and
  # left to the host compiler in another extension of the same directory.
  if(ARG_FORCE_DEVICE_COMPILER)
    set(_mode device)
  else()
    set(_mode host)
  endif()
  foreach(_src IN LISTS _src_host)
    get_filename_component(_abs "${_src}" ABSOLUTE)
    string(MD5 _key "${_abs}")
    get_property(_prev DIRECTORY PROPERTY _KILN_EXT_MODE_${_key})
    if(_prev AND NOT _prev MATCHES "^${_mode};")
      list(GET _prev 1 _prev_target)
      message(FATAL_ERROR
        "kiln_add_extension(${name}): '${_src}' is compiled as ${_mode} code here but extension "
        "'${_prev_target}' in the same directory compiles it differently (FORCE_DEVICE_COMPILER). A source's "
        "language is per directory in CMake: define one of the two extensions in another directory.")
    endif()
    set_property(DIRECTORY PROPERTY _KILN_EXT_MODE_${_key} "${_mode};${name}")
  endforeach()

  set(_needs "${_src_cuda}")
  if(ARG_FORCE_DEVICE_COMPILER AND NOT _src_musa)
    list(APPEND _needs ${_src_host})
  endif()
  set(${out} "${_needs}" PARENT_SCOPE)
endfunction()

# Makes sure a CUDA compiler is there, or stops with a message that says how to point at one.
function(_kiln_extension_find_cuda name sources)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND KILN_CUDA_COMPILER
     AND EXISTS "${KILN_CUDA_COMPILER}")
    # Default to the compiler Kiln itself was built with.
    set(CMAKE_CUDA_COMPILER "${KILN_CUDA_COMPILER}" CACHE FILEPATH "CUDA compiler")
  endif()
  if(CMAKE_CUDA_COMPILER AND NOT EXISTS "${CMAKE_CUDA_COMPILER}")
    message(FATAL_ERROR
      "kiln_add_extension(${name}): CMAKE_CUDA_COMPILER is '${CMAKE_CUDA_COMPILER}', which does not exist. "
      "Point it at nvcc: -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc (in a fresh build directory).")
  endif()
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    list(GET sources 0 _first)
    message(FATAL_ERROR
      "kiln_add_extension(${name}): '${_first}' needs a CUDA compiler (nvcc) and none was found. "
      "Install the CUDA toolkit, or point CMake at nvcc with -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc "
      "or the CUDACXX environment variable (CUDACXX=/usr/local/cuda/bin/nvcc), in a fresh build directory.")
  endif()
endfunction()

# Compiles .mu sources with mcc through custom commands (CMake has no MUSA language) and adds the
# objects to the target.
function(_kiln_extension_musa name sources flags)
  if(NOT KILN_MUSA_COMPILER)
    find_program(KILN_MUSA_COMPILER mcc HINTS ENV MUSA_HOME ENV MUSA_PATH PATH_SUFFIXES bin
                 PATHS /usr/local/musa/bin DOC "MUSA compiler (mcc)")
  endif()
  if(NOT KILN_MUSA_COMPILER)
    list(GET sources 0 _first)
    message(FATAL_ERROR
      "kiln_add_extension(${name}): '${_first}' needs the MUSA compiler (mcc) and none was found. "
      "Install the MUSA toolkit, or point at mcc with -DKILN_MUSA_COMPILER=/usr/local/musa/bin/mcc or the "
      "MUSA_HOME environment variable.")
  endif()
  # The target's include directories and definitions, Kiln's usage requirements included.
  set(_inc "$<FILTER:$<REMOVE_DUPLICATES:$<TARGET_PROPERTY:${name},INCLUDE_DIRECTORIES>>,EXCLUDE,^$>")
  set(_def "$<FILTER:$<REMOVE_DUPLICATES:$<TARGET_PROPERTY:${name},COMPILE_DEFINITIONS>>,EXCLUDE,^$>")
  set(_objects "")
  foreach(_src IN LISTS sources)
    get_filename_component(_abs "${_src}" ABSOLUTE)
    file(RELATIVE_PATH _rel "${CMAKE_CURRENT_SOURCE_DIR}" "${_abs}")
    string(REPLACE ".." "__" _rel "${_rel}")
    set(_obj "${CMAKE_CURRENT_BINARY_DIR}/CMakeFiles/${name}.dir/musa/${_rel}.o")
    get_filename_component(_obj_dir "${_obj}" DIRECTORY)
    file(MAKE_DIRECTORY "${_obj_dir}")
    add_custom_command(
      OUTPUT "${_obj}"
      COMMAND "${KILN_MUSA_COMPILER}" -std=c++20 -fPIC -DKILN_VENDOR_MUSA=1 "$<$<BOOL:${_def}>:-D$<JOIN:${_def},;-D>>"
              "$<$<BOOL:${_inc}>:-I$<JOIN:${_inc},;-I>>" ${flags} -MD -MF "${_obj}.d" -c "${_abs}" -o "${_obj}"
      DEPENDS "${_abs}"
      DEPFILE "${_obj}.d"
      COMMENT "Building MUSA object ${_rel}.o"
      COMMAND_EXPAND_LISTS VERBATIM)
    list(APPEND _objects "${_obj}")
  endforeach()
  target_sources(${name} PRIVATE ${_objects})
  set_source_files_properties(${_objects} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  find_library(KILN_MUSART_LIBRARY musart HINTS ENV MUSA_HOME ENV MUSA_PATH PATH_SUFFIXES lib lib64
               PATHS /usr/local/musa/lib)
  if(KILN_MUSART_LIBRARY)
    target_link_libraries(${name} PRIVATE "${KILN_MUSART_LIBRARY}")
  endif()
endfunction()

function(_kiln_add_extension_target name)
  _kiln_extension_parse(1)
  if(NOT TARGET Kiln::kiln)
    message(FATAL_ERROR "kiln_add_extension(${name}): no Kiln::kiln target; call find_package(Kiln) first")
  endif()
  if(ARG_MODULE AND ARG_SHARED)
    message(FATAL_ERROR "kiln_add_extension(${name}): give MODULE or SHARED, not both")
  endif()
  _kiln_extension_classify(${name} _src ${ARG_SOURCES})
  if(NOT _src_host AND NOT _src_cuda AND NOT _src_musa)
    message(FATAL_ERROR "kiln_add_extension(${name}): SOURCES has headers only; nothing to compile")
  endif()

  if(ARG_MODULE)
    add_library(${name} MODULE ${ARG_SOURCES})
  else()
    add_library(${name} SHARED ${ARG_SOURCES})
  endif()
  target_link_libraries(${name} PRIVATE Kiln::kiln)
  set_target_properties(${name} PROPERTIES CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
                                           POSITION_INDEPENDENT_CODE ON)
  if(ARG_OUTPUT_NAME)
    set_target_properties(${name} PROPERTIES OUTPUT_NAME ${ARG_OUTPUT_NAME})
  endif()

  if(ARG_FORCE_DEVICE_COMPILER AND _src_host)
    if(_src_musa)
      # Host sources join the .mu ones through mcc.
      set_source_files_properties(${_src_host} PROPERTIES HEADER_FILE_ONLY TRUE)
      list(APPEND _src_musa ${_src_host})
    else()
      set_source_files_properties(${_src_host} PROPERTIES LANGUAGE CUDA)
    endif()
  endif()
  if(_src_cuda OR (ARG_FORCE_DEVICE_COMPILER AND _src_host AND NOT _src_musa))
    set_target_properties(${name} PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF
                                             CUDA_RUNTIME_LIBRARY Shared)
    # nvcc cannot evaluate fmt's consteval format-string checks (Kiln's headers use fmt through
    # KILN_CHECK): device-compiled sources check format strings at run time instead.
    target_compile_definitions(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:FMT_CONSTEVAL=>
                                               $<$<COMPILE_LANGUAGE:CUDA>:FMT_USE_CONSTEXPR=1>)
  endif()
  if(_src_musa)
    set_source_files_properties(${_src_musa} PROPERTIES HEADER_FILE_ONLY TRUE)
    _kiln_extension_musa(${name} "${_src_musa}" "${ARG_DEVICE_FLAGS}")
  endif()

  # Each compiler gets its own flags (quoted so that a flag list stays inside its generator expression).
  target_compile_options(${name} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${ARG_CXX_FLAGS}>"
                                         "$<$<COMPILE_LANGUAGE:CUDA>:${ARG_DEVICE_FLAGS}>")
endfunction()
