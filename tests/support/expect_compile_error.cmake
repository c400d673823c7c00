# Builds one compile-fail target and passes when the build fails with output matching REGEX.
# cmake -DTARGET=<target> -DBUILD_DIR=<dir> -DREGEX=<regex> [-DCONFIG=<config>] -P this file
set(_cmd "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}")
if(CONFIG)
  list(APPEND _cmd --config "${CONFIG}")
endif()
execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(_rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled; it must not:\n${_out}")
endif()
if(NOT _out MATCHES "${REGEX}")
  message(FATAL_ERROR "${TARGET} failed to compile, but without the expected message\n"
                      "  expected: ${REGEX}\n  got:\n${_out}")
endif()
message(STATUS "${TARGET}: fails to compile with the expected message")
