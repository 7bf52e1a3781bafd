# The include graph follows the layers (docs/design.md, "Layers"):
#
#   core -> graph -> ops -> autocast -> autodiff -> exec -> inspect -> train -> distributed
#
# A header may include headers of its own layer and of the layers to its left, never of a layer to
# its right. Two more rules:
#   - backends: only exec/cuda/ itself and the umbrella <typegrad/cuda.hpp> include exec/cuda/
#     (the CUDA backend is optional; nothing else may need the toolkit);
#   - the umbrella headers at the top level (typegrad.hpp, cuda.hpp, version.hpp) are included
#     by no library header.
#
# Usage: cmake -DINCLUDE_DIR=<dir holding typegrad/> -P check_layers.cmake
# Fails (FATAL_ERROR) listing every offending include, "file: #include <...> (layer -> layer)".
if(NOT INCLUDE_DIR)
  message(FATAL_ERROR "check_layers.cmake: pass -DINCLUDE_DIR=<directory that holds typegrad/>")
endif()

set(layers core graph ops autocast autodiff exec inspect train distributed)

# The layer of a header path relative to INCLUDE_DIR ("typegrad/ops/exp_log.hpp" -> index 2);
# -1 for the top-level umbrella headers, -2 for a folder that is not a layer.
function(layer_of path out)
  if(path MATCHES "^typegrad/([a-z_]+)/")
    list(FIND layers "${CMAKE_MATCH_1}" index)
    if(index EQUAL -1)
      set(index -2)
    endif()
  else()
    set(index -1)
  endif()
  set(${out} ${index} PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE headers RELATIVE ${INCLUDE_DIR} ${INCLUDE_DIR}/typegrad/*.hpp)
if(NOT headers)
  message(FATAL_ERROR "check_layers.cmake: no headers under ${INCLUDE_DIR}/typegrad")
endif()
set(problems "")
set(edges 0)
foreach(header IN LISTS headers)
  layer_of(${header} from)
  if(from EQUAL -2)
    string(APPEND problems "\n  ${header}: its folder is not a layer (${layers})")
    continue()
  endif()
  file(STRINGS ${INCLUDE_DIR}/${header} includes REGEX "^[ \t]*#[ \t]*include[ \t]*<typegrad/[^>]+>")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*<(typegrad/[^>]+)>.*$" "\\1" target "${line}")
    math(EXPR edges "${edges} + 1")
    layer_of(${target} to)
    if(to EQUAL -1)
      if(NOT from EQUAL -1)
        string(APPEND problems "\n  ${header}: #include <${target}> (an umbrella header)")
      endif()
      continue()
    endif()
    if(from GREATER_EQUAL 0 AND to GREATER from)
      list(GET layers ${from} from_name)
      list(GET layers ${to} to_name)
      string(APPEND problems "\n  ${header}: #include <${target}> (${from_name} -> ${to_name})")
    endif()
    if(target MATCHES "^typegrad/exec/cuda/" AND NOT header MATCHES "^typegrad/(exec/cuda/|cuda\\.hpp$)")
      string(APPEND problems "\n  ${header}: #include <${target}> (only the CUDA backend and cuda.hpp include it)")
    endif()
  endforeach()
endforeach()

list(LENGTH headers count)
if(problems)
  message(FATAL_ERROR "typegrad: includes against the layers (${layers}):${problems}")
endif()
message(STATUS "typegrad: ${count} headers, ${edges} includes, all along the layers")
