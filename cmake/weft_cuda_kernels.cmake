# Reduction kernels for device memory (collectives/reduce_cuda.cu), included
# by CMakeLists.txt after the weft_collectives layer exists.
#
# nvcc builds one fatbin for an explicit list of architectures -- never
# `native`: the build machine may have no GPU, or another one than the
# machines that run the library -- plus the PTX of the newest, which drivers
# of GPUs newer than the list compile at load time. cmake/check_fatbin.cmake
# checks it (fatbin magic, every entry point in every image), then
# cmake/bin2c.cmake turns it into a byte array (hidden symbols) compiled into
# weft_collectives. collectives/reduce_device.c loads it at run time with
# cuModuleLoadData; as for the rest of weft, no CUDA library is linked.
#
# WEFT_CUDA_KERNELS: AUTO builds the kernels when the CUDA headers and nvcc
# are found, ON insists, OFF never builds them. Without them, device
# reductions stage through host memory (weft_reduce_device_available says
# "no reduction kernels in this build").
# WEFT_CUDA_ARCHS: "default" (the architectures below that this nvcc knows),
# or a list of compute capabilities without dots, e.g. "80;90".
# Sets WEFT_HAVE_REDUCE_FATBIN (compile definition and variable) when built.

set(WEFT_CUDA_KERNELS AUTO CACHE STRING "CUDA reduction kernels built by nvcc (AUTO, ON, OFF)")
set_property(CACHE WEFT_CUDA_KERNELS PROPERTY STRINGS AUTO ON OFF)
set(WEFT_CUDA_ARCHS default CACHE STRING
    "GPU architectures of the reduction kernels: default, or a list like 80;90 (PTX of the newest is added)")
# Turing, Ampere, Hopper, Blackwell (data centre and consumer): SASS for
# each major generation; sm_86/87/89 run the sm_80 code, sm_103 the sm_100
# code, sm_121 the sm_120 code (same major, newer minor).
set(WEFT_CUDA_ARCHS_DEFAULT 75 80 90 100 120)

set(WEFT_HAVE_REDUCE_FATBIN "")
string(TOUPPER "${WEFT_CUDA_KERNELS}" _wk_mode)
if(NOT _wk_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "WEFT_CUDA_KERNELS=${WEFT_CUDA_KERNELS}: expected AUTO, ON or OFF")
endif()

set(_wk_why "")
if(_wk_mode STREQUAL "OFF")
  set(_wk_why "WEFT_CUDA_KERNELS=OFF")
elseif(NOT WEFT_HAVE_CUDA_HEADERS)
  set(_wk_why "no CUDA headers (WEFT_WITH_CUDA)")
else()
  set(_wk_hints /usr/local/cuda/bin)
  if(DEFINED ENV{CUDA_HOME})
    list(PREPEND _wk_hints "$ENV{CUDA_HOME}/bin")
  endif()
  find_program(WEFT_NVCC nvcc HINTS ${_wk_hints})
  if(NOT WEFT_NVCC)
    set(_wk_why "nvcc not found (looked in ${_wk_hints} and PATH; set WEFT_NVCC)")
  endif()
endif()

if(NOT _wk_why)
  # What this nvcc can build: "compute_75", "compute_80", ...
  execute_process(COMMAND ${WEFT_NVCC} --list-gpu-arch OUTPUT_VARIABLE _wk_out ERROR_VARIABLE _wk_err
                  RESULT_VARIABLE _wk_rc)
  string(REGEX MATCHALL "compute_[0-9]+" _wk_known "${_wk_out}")
  string(REPLACE "compute_" "" _wk_known "${_wk_known}")
  if(NOT _wk_rc EQUAL 0 OR NOT _wk_known)
    set(_wk_why "${WEFT_NVCC} --list-gpu-arch failed (${_wk_rc}): ${_wk_err}")
  elseif(WEFT_CUDA_ARCHS STREQUAL "default")
    set(_wk_archs "")
    foreach(a ${WEFT_CUDA_ARCHS_DEFAULT})
      if(a IN_LIST _wk_known)
        list(APPEND _wk_archs ${a})
      endif()
    endforeach()
    if(NOT _wk_archs)
      set(_wk_why "${WEFT_NVCC} supports none of ${WEFT_CUDA_ARCHS_DEFAULT}")
    endif()
  else()
    # An explicit list is taken as asked, or refused: a silently dropped
    # architecture would show only on the GPU that needed it.
    set(_wk_archs "")
    foreach(a ${WEFT_CUDA_ARCHS})
      if(a STREQUAL "native" OR a MATCHES "^(all|all-major)$")
        message(FATAL_ERROR "WEFT_CUDA_ARCHS=${WEFT_CUDA_ARCHS}: '${a}' is not allowed; name the "
                            "architectures (the build machine is not the one that runs weft)")
      endif()
      if(NOT a IN_LIST _wk_known)
        string(REPLACE ";" " " _wk_k "${_wk_known}")
        message(FATAL_ERROR "WEFT_CUDA_ARCHS=${WEFT_CUDA_ARCHS}: ${WEFT_NVCC} cannot build '${a}' "
                            "(it knows: ${_wk_k})")
      endif()
      list(APPEND _wk_archs ${a})
    endforeach()
    list(REMOVE_DUPLICATES _wk_archs)
  endif()
endif()

if(_wk_why)
  if(_wk_mode STREQUAL "ON")
    message(FATAL_ERROR "WEFT_CUDA_KERNELS=ON but ${_wk_why}")
  endif()
  message(STATUS "weft: CUDA reduction kernels: no (${_wk_why}); device reductions stage through host memory")
  return()
endif()

list(SORT _wk_archs COMPARE NATURAL)
list(GET _wk_archs -1 _wk_newest)
set(_wk_gencode "")
foreach(a ${_wk_archs})
  list(APPEND _wk_gencode -gencode arch=compute_${a},code=sm_${a})
endforeach()
list(APPEND _wk_gencode -gencode arch=compute_${_wk_newest},code=compute_${_wk_newest})
# Compressed images: a fifth of the size (zstd, nvcc >= 12.8); the driver
# decompresses once, at cuModuleLoadData.
execute_process(COMMAND ${WEFT_NVCC} --help OUTPUT_VARIABLE _wk_help ERROR_QUIET)
set(_wk_flags -std=c++17)
if(_wk_help MATCHES "--compress-mode")
  list(APPEND _wk_flags -compress-mode=size)
endif()
if(WEFT_WERROR)
  list(APPEND _wk_flags -Werror all-warnings)
endif()
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  list(APPEND _wk_flags -ccbin ${CMAKE_CXX_COMPILER})
endif()

set(_wk_src ${PROJECT_SOURCE_DIR}/collectives/reduce_cuda.cu)
set(_wk_dir ${PROJECT_BINARY_DIR}/reduce_cuda)
set(_wk_fatbin ${_wk_dir}/reduce_cuda.fatbin)
set(_wk_c ${_wk_dir}/reduce_cuda_fatbin.c)
string(REPLACE ";" "," _wk_archs_csv "${_wk_archs}")
# The command line as a file: a changed architecture list or flag rebuilds
# the fatbin (make does not compare command lines).
string(REPLACE ";" " " _wk_cmdline "${WEFT_NVCC} ${_wk_gencode} ${_wk_flags}")
file(CONFIGURE OUTPUT ${_wk_dir}/nvcc_command.txt CONTENT "${_wk_cmdline}\n")

# nvcc writes to .tmp; the check runs on it and renames it, so a fatbin that
# failed the check is never taken as up to date. --keep leaves the images
# that went into the fatbin uncompressed for the check.
add_custom_command(OUTPUT ${_wk_fatbin}
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${_wk_dir}/keep
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_wk_dir}/keep
  COMMAND ${WEFT_NVCC} --fatbin ${_wk_gencode} ${_wk_flags} --keep --keep-dir ${_wk_dir}/keep
          -o ${_wk_fatbin}.tmp ${_wk_src}
  COMMAND ${CMAKE_COMMAND} -DFATBIN=${_wk_fatbin}.tmp -DKEEP_DIR=${_wk_dir}/keep "-DARCHS=${_wk_archs_csv}"
          -DPTX=${_wk_newest} -P ${PROJECT_SOURCE_DIR}/cmake/check_fatbin.cmake
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${_wk_dir}/keep
  COMMAND ${CMAKE_COMMAND} -E rename ${_wk_fatbin}.tmp ${_wk_fatbin}
  DEPENDS ${_wk_src} ${_wk_dir}/nvcc_command.txt ${PROJECT_SOURCE_DIR}/cmake/check_fatbin.cmake
  COMMENT "nvcc: reduction kernels for sm_${_wk_archs_csv} + PTX ${_wk_newest}"
  VERBATIM)
add_custom_command(OUTPUT ${_wk_c}
  COMMAND ${CMAKE_COMMAND} -DINPUT=${_wk_fatbin} -DOUTPUT=${_wk_c} -DSYMBOL=weft_reduce_fatbin
          "-DDESCRIPTION=sm_${_wk_archs_csv} + PTX ${_wk_newest}" -P ${PROJECT_SOURCE_DIR}/cmake/bin2c.cmake
  DEPENDS ${_wk_fatbin} ${PROJECT_SOURCE_DIR}/cmake/bin2c.cmake
  COMMENT "bin2c: reduce_cuda.fatbin -> reduce_cuda_fatbin.c"
  VERBATIM)
target_sources(weft_collectives PRIVATE ${_wk_c})
add_compile_definitions(WEFT_HAVE_REDUCE_FATBIN=1)
set(WEFT_HAVE_REDUCE_FATBIN 1)
message(STATUS "weft: CUDA reduction kernels: yes (${WEFT_NVCC}, sm_${_wk_archs_csv} + PTX ${_wk_newest})")
