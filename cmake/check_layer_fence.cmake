# ctest "layer_fence": no layer below the API (core, transports, p2p,
# collectives, stream, comm, ...) calls a public weft_* function. The public
# calls validate arguments, keep the comm's last error and may take the
# comm's locks: a lower layer that calls one runs back up through the layers
# (docs/design.md, "Layers"). A lower layer uses the internal call the public
# one forwards to (weft_err_str for weft_strerror, ...).
# Run as: cmake -DNM=nm -DHEADER=weft.h -DOBJECTS="a.o|b.o|..." -P check_layer_fence.cmake
cmake_minimum_required(VERSION 3.18)

foreach(v NM HEADER OBJECTS)
  if(NOT ${v})
    message(FATAL_ERROR "check_layer_fence: -D${v}=... is required")
  endif()
endforeach()

file(READ ${HEADER} header)
string(REGEX MATCHALL "WEFT_API[^;(]*[ *](weft_[A-Za-z0-9_]+)[ ]*\\(" decls "${header}")
set(public "")
foreach(d IN LISTS decls)
  string(REGEX MATCH "(weft_[A-Za-z0-9_]+)[ ]*\\($" _ "${d}")
  list(APPEND public ${CMAKE_MATCH_1})
endforeach()
list(LENGTH public npublic)
if(npublic LESS 10)
  message(FATAL_ERROR "found ${npublic} WEFT_API declarations in ${HEADER}; the parser is out of date")
endif()

string(REPLACE "|" ";" objects "${OBJECTS}")
list(REMOVE_ITEM objects "")
list(LENGTH objects nobj)
if(nobj LESS 10)
  message(FATAL_ERROR "only ${nobj} object files given; the test's registration is out of date")
endif()
set(calls "")
foreach(o IN LISTS objects)
  execute_process(COMMAND ${NM} --undefined-only ${o}
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} --undefined-only ${o} failed (${rc}): ${err}")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  foreach(line IN LISTS lines)
    if(line MATCHES "U +(weft_[A-Za-z0-9_]+)")
      if(CMAKE_MATCH_1 IN_LIST public)
        get_filename_component(f ${o} NAME)
        list(APPEND calls "${f} calls ${CMAKE_MATCH_1}")
      endif()
    endif()
  endforeach()
endforeach()
if(calls)
  list(JOIN calls "\n  " c)
  message(FATAL_ERROR "a layer below the API calls the public API (use the internal call it forwards to):\n  ${c}")
endif()
message(STATUS "layer_fence: ${nobj} objects below the API call none of the ${npublic} public functions")
