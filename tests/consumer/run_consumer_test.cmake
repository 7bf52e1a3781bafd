# Installs the build tree into a fresh prefix and builds tests/consumer/project against it,
# once through find_package(typegrad CONFIG) and once through add_subdirectory.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${prefix} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "cmake --install failed")
endif()
# pkg-config: the installed typegrad.pc alone must be enough to compile the consumer.
find_program(PKG_CONFIG_EXECUTABLE pkg-config)
if(PKG_CONFIG_EXECUTABLE)
  set(ENV{PKG_CONFIG_PATH} ${prefix}/share/pkgconfig)
  execute_process(COMMAND ${PKG_CONFIG_EXECUTABLE} --cflags typegrad RESULT_VARIABLE rc
                  OUTPUT_VARIABLE cflags OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc)
    message(FATAL_ERROR "pkg-config --cflags typegrad failed")
  endif()
  separate_arguments(cflags UNIX_COMMAND "${cflags}")
  execute_process(COMMAND ${CXX_COMPILER} ${cflags} -O1 ${SOURCE_DIR}/tests/consumer/project/main.cpp
                          -o ${WORK_DIR}/consumer_pkgconfig RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "compiling the consumer with pkg-config's flags (${cflags}) failed")
  endif()
  execute_process(COMMAND ${WORK_DIR}/consumer_pkgconfig RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  if(rc)
    message(FATAL_ERROR "the consumer (pkg-config) failed: ${out}")
  endif()
  message(STATUS "consumer (pkg-config): ${out}")
endif()
foreach(mode find_package add_subdirectory)
  set(build ${WORK_DIR}/build_${mode})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer/project -B ${build}
                    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
                    -DCMAKE_PREFIX_PATH=${prefix} -DTYPEGRAD_CONSUMER_MODE=${mode}
                    -DTYPEGRAD_SOURCE_DIR=${SOURCE_DIR}
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "configuring the consumer (${mode}) failed")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${build} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "building the consumer (${mode}) failed")
  endif()
  execute_process(COMMAND ${build}/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  if(rc)
    message(FATAL_ERROR "the consumer (${mode}) failed: ${out}")
  endif()
  message(STATUS "consumer (${mode}): ${out}")
endforeach()
