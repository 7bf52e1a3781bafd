# Runs one compile-fail build and checks that its FIRST error is the expected typegrad: sentence
# (a PASS_REGULAR_EXPRESSION alone would accept it after unrelated errors).
#   cmake -DBINARY_DIR=... -DTARGET=... -DSOURCE=<the test's source> -DEXPECTED=<regex> -P check_first_error.cmake
#   (-DMAKE_PROGRAM=<ninja>: the compile command is read from Ninja's manifest, which `-t commands`
#   reads without touching the build logs, and run here, so that these tests run in parallel
#   beside each other and beside builds of the same directory)
if(MAKE_PROGRAM AND EXISTS ${BINARY_DIR}/build.ninja)
  execute_process(COMMAND ${MAKE_PROGRAM} -C ${BINARY_DIR} -t commands ${TARGET}
                  OUTPUT_VARIABLE commands RESULT_VARIABLE rc)
  # the test's own compile command: the manifest lists its precompiled header's build first
  string(REPLACE "\n" ";" lines "${commands}")
  set(compile "")
  foreach(line IN LISTS lines)
    string(FIND "${line}" " -c ${SOURCE}" at)
    if(at GREATER -1)
      set(compile "${line}")
    endif()
  endforeach()
  if(rc OR NOT compile)
    message(FATAL_ERROR "${TARGET}: no compile command in the Ninja manifest")
  endif()
  execute_process(COMMAND sh -c "${compile}" WORKING_DIRECTORY ${BINARY_DIR}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
else()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} --target ${TARGET}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
endif()
set(all "${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, but it must be rejected with: ${EXPECTED}")
endif()
# g++: "error: static assertion failed: typegrad: ..."; clang: "error: static_assert failed ... "typegrad: ...""
string(REGEX MATCH "[^\n]*error: [^\n]*" first "${all}")
if(NOT first MATCHES "${EXPECTED}")
  message(FATAL_ERROR "${TARGET}: the first error is not the expected sentence (${EXPECTED}):\n${first}\n\nfull output:\n${all}")
endif()
message(STATUS "${TARGET}: first error: ${first}")
