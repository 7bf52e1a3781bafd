# Runs one compile-fail build and checks that its FIRST error is the expected typegrad: sentence
# (a PASS_REGULAR_EXPRESSION alone would accept it after unrelated errors).
#   cmake -DBINARY_DIR=... -DTARGET=... -DEXPECTED=<regex> -P check_first_error.cmake
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} --target ${TARGET}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
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
