# Package tests, one step per run:
#   cmake -DSTEP=install|find_package|add_subdirectory -DTILEGRAD_SOURCE_DIR=... \
#         -DTILEGRAD_BINARY_DIR=... -DCONSUMER_SOURCE_DIR=... -DWORK_DIR=... \
#         [-DBUILD_TYPE=...] [-DGENERATOR=...] [-DMAKE_PROGRAM=...] [-DCXX_COMPILER=...] \
#         [-DUSE_XSIMD=ON|OFF] [-DUSE_TBB=ON|OFF] [-DUSE_OPENMP=ON|OFF] -P package_test.cmake
#
#   install           cmake --install the build tree into WORK_DIR/prefix
#   find_package      configure + build + run the consumer against WORK_DIR/prefix
#   add_subdirectory  configure + build + run the consumer on top of the source tree
cmake_minimum_required(VERSION 3.21)

foreach(_var IN ITEMS STEP TILEGRAD_SOURCE_DIR TILEGRAD_BINARY_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "package_test.cmake: -D${_var}=... is required")
  endif()
endforeach()
foreach(_var IN ITEMS USE_XSIMD USE_TBB USE_OPENMP)
  if(NOT DEFINED ${_var})
    set(${_var} ON)
  endif()
endforeach()

set(_prefix "${WORK_DIR}/prefix")

if(NOT EXISTS "${TILEGRAD_SOURCE_DIR}/include/tilegrad/tilegrad.hpp")
  message(STATUS "TILEGRAD_PACKAGE_TEST_SKIPPED: include/tilegrad/tilegrad.hpp does not exist")
  return()
endif()

function(run_checked what)
  string(REPLACE ";" " " _shown "${ARGN}")
  message(STATUS "${what}: ${_shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${_rc})")
  endif()
endfunction()

set(_config_args)
if(BUILD_TYPE)
  set(_config_args --config "${BUILD_TYPE}")
endif()

if(STEP STREQUAL "install")
  file(REMOVE_RECURSE "${_prefix}")
  run_checked("install" "${CMAKE_COMMAND}" --install "${TILEGRAD_BINARY_DIR}"
    --prefix "${_prefix}" ${_config_args})
  file(GLOB_RECURSE _configs "${_prefix}/*/tilegradConfig.cmake")
  if(NOT _configs)
    message(FATAL_ERROR "no tilegradConfig.cmake under ${_prefix}")
  endif()
  if(NOT EXISTS "${_prefix}/include/tilegrad/tilegrad.hpp")
    message(FATAL_ERROR "tilegrad/tilegrad.hpp was not installed under ${_prefix}/include")
  endif()
  return()
endif()

set(_configure_args -S "${CONSUMER_SOURCE_DIR}")
if(GENERATOR)
  list(APPEND _configure_args -G "${GENERATOR}")
endif()
if(MAKE_PROGRAM)
  list(APPEND _configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_COMPILER)
  list(APPEND _configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(BUILD_TYPE)
  list(APPEND _configure_args "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
endif()
list(APPEND _configure_args
  "-DTILEGRAD_EXPECT_USE_XSIMD=${USE_XSIMD}"
  "-DTILEGRAD_EXPECT_USE_TBB=${USE_TBB}"
  "-DTILEGRAD_EXPECT_USE_OPENMP=${USE_OPENMP}")

if(STEP STREQUAL "find_package")
  if(NOT EXISTS "${_prefix}")
    message(FATAL_ERROR "${_prefix} does not exist: run the package.install test first")
  endif()
  set(_build "${WORK_DIR}/consumer_find_package")
  list(APPEND _configure_args -B "${_build}"
    -DTILEGRAD_CONSUMER_MODE=find_package
    "-DCMAKE_PREFIX_PATH=${_prefix}"
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
elseif(STEP STREQUAL "add_subdirectory")
  set(_build "${WORK_DIR}/consumer_add_subdirectory")
  list(APPEND _configure_args -B "${_build}"
    -DTILEGRAD_CONSUMER_MODE=add_subdirectory
    "-DTILEGRAD_SOURCE_DIR=${TILEGRAD_SOURCE_DIR}"
    "-DTILEGRAD_USE_XSIMD=${USE_XSIMD}"
    "-DTILEGRAD_USE_TBB=${USE_TBB}"
    "-DTILEGRAD_USE_OPENMP=${USE_OPENMP}")
else()
  message(FATAL_ERROR "unknown STEP '${STEP}'")
endif()

file(REMOVE_RECURSE "${_build}")
run_checked("configure" "${CMAKE_COMMAND}" ${_configure_args})

if(STEP STREQUAL "find_package")
  # The package must come from the prefix just installed, not from anywhere else.
  file(STRINGS "${_build}/CMakeCache.txt" _dir_line REGEX "^tilegrad_DIR:")
  string(REGEX REPLACE "^tilegrad_DIR:[A-Z]+=" "" _found_dir "${_dir_line}")
  file(REAL_PATH "${_found_dir}" _found_dir)
  file(REAL_PATH "${_prefix}" _real_prefix)
  string(FIND "${_found_dir}" "${_real_prefix}/" _pos)
  if(NOT _pos EQUAL 0)
    message(FATAL_ERROR "tilegrad was found in ${_found_dir}, not under ${_real_prefix}")
  endif()
endif()

run_checked("build" "${CMAKE_COMMAND}" --build "${_build}" ${_config_args})

set(_suffix "")
if(CMAKE_HOST_WIN32)
  set(_suffix ".exe")
endif()
foreach(_name IN ITEMS consumer consumer_separate)
  if(BUILD_TYPE AND EXISTS "${_build}/${BUILD_TYPE}/${_name}${_suffix}")
    set(_exe "${_build}/${BUILD_TYPE}/${_name}${_suffix}") # multi-config generators
  else()
    set(_exe "${_build}/${_name}${_suffix}")
  endif()
  if(_name STREQUAL "consumer" OR STEP STREQUAL "find_package")
    run_checked("run ${_name}" "${_exe}")
  endif()
endforeach()
