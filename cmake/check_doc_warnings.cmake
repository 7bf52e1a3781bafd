# Run by the docs target after Doxygen: fails when Doxygen's warnings file is not empty, i.e. when
# a public name has no doc comment (or a guide has a broken link or markup). Public means every
# name in namespace typegrad and its nested namespaces except typegrad::detail,
# typegrad::cuda::detail and typegrad::simd (docs/Doxyfile.in, EXCLUDE_SYMBOLS), and the public and
# protected members of classes. Usage: cmake -DWARNINGS=<file> -P check_doc_warnings.cmake
file(READ "${WARNINGS}" text)
string(STRIP "${text}" text)
if(NOT text STREQUAL "")
  string(REGEX MATCHALL "\n" lines "${text}")
  list(LENGTH lines n)
  math(EXPR n "${n} + 1")
  message("${text}")
  message(FATAL_ERROR "typegrad: the API reference has ${n} lines of Doxygen warnings, listed above and in "
                      "${WARNINGS}: document each public name named there with a // comment above its "
                      "declaration")
endif()
message(STATUS "typegrad: API reference complete: no Doxygen warnings")
