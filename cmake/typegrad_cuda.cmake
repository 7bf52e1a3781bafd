# The optional CUDA backend (docs/cuda.md): TYPEGRAD_CUDA = AUTO (default: on when the CUDA
# toolkit is found), ON (required) or OFF. The backend is header-only too; its target
# typegrad::cuda adds the toolkit's headers and links NVRTC, cuBLAS and libdl (the driver,
# libcuda.so.1, is opened at run time, so programs start on machines without one). Nothing is
# compiled by nvcc: generated kernels are compiled at run time by NVRTC, so the CUDA language
# (check_language(CUDA)) is not needed; find_package(CUDAToolkit) is.
set(TYPEGRAD_CUDA AUTO CACHE STRING "Build the CUDA backend's tests and benchmarks: AUTO, ON or OFF")
set_property(CACHE TYPEGRAD_CUDA PROPERTY STRINGS AUTO ON OFF)

set(TYPEGRAD_CUDA_ENABLED OFF)
if(NOT TYPEGRAD_CUDA STREQUAL "OFF")
  if(TYPEGRAD_CUDA STREQUAL "ON")
    find_package(CUDAToolkit REQUIRED)
  else()
    find_package(CUDAToolkit QUIET)
  endif()
  if(CUDAToolkit_FOUND AND TARGET CUDA::nvrtc AND TARGET CUDA::cublas)
    set(TYPEGRAD_CUDA_ENABLED ON)
  elseif(TYPEGRAD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TYPEGRAD_CUDA=ON but the CUDA toolkit lacks NVRTC or cuBLAS")
  endif()
endif()

if(TYPEGRAD_CUDA_ENABLED)
  message(STATUS "typegrad: CUDA backend enabled (CUDA toolkit ${CUDAToolkit_VERSION} at ${CUDAToolkit_LIBRARY_DIR})")
  add_library(typegrad_cuda INTERFACE)
  add_library(typegrad::cuda ALIAS typegrad_cuda)
  set_target_properties(typegrad_cuda PROPERTIES EXPORT_NAME cuda)
  # NVRTC's library file, not the CUDA::nvrtc target: CMake's target also links the driver
  # (libcuda), which a linker without --as-needed (clang here) keeps as a load-time dependency,
  # and then the program cannot start on a machine without a driver.
  get_target_property(typegrad_nvrtc_library CUDA::nvrtc IMPORTED_LOCATION)
  target_link_libraries(typegrad_cuda INTERFACE typegrad ${typegrad_nvrtc_library} CUDA::cublas ${CMAKE_DL_LIBS})
  # The toolkit's headers as system headers (cuda.h, nvrtc.h, cublas_v2.h).
  target_include_directories(typegrad_cuda SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
  install(TARGETS typegrad_cuda EXPORT typegrad_cuda_targets)
  install(EXPORT typegrad_cuda_targets NAMESPACE typegrad:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/typegrad)
else()
  message(STATUS "typegrad: CUDA backend not built (TYPEGRAD_CUDA=${TYPEGRAD_CUDA}; toolkit found: ${CUDAToolkit_FOUND})")
endif()
