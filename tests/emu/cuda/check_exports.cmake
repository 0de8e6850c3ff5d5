# ctest "emu_cuda_exports": libweft_emu_cuda.so exports only cuda*, cu* and
# weft_emu_cuda_* names, and the calls weft and the tests rely on are there.
# Run as: cmake -DNM=nm -DLIB=libweft_emu_cuda.so -P check_exports.cmake
cmake_minimum_required(VERSION 3.18)
foreach(v NM LIB)
  if(NOT ${v})
    message(FATAL_ERROR "check_exports: -D${v}=... is required")
  endif()
endforeach()
execute_process(COMMAND ${NM} -D --defined-only ${LIB}
  OUTPUT_VARIABLE nm_out ERROR_VARIABLE nm_err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIB} failed (${rc}): ${nm_err}")
endif()
set(linker_symbols _init _fini _edata _end __bss_start _DYNAMIC _GLOBAL_OFFSET_TABLE_)
string(REPLACE "\n" ";" lines "${nm_out}")
set(exported "")
set(strays "")
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^[0-9a-fA-F]* *[A-Za-z] +([^ @]+)")
    continue()
  endif()
  set(name "${CMAKE_MATCH_1}")
  if(name IN_LIST linker_symbols)
    continue()
  endif()
  if(name MATCHES "^(cuda|cu[A-Z]|weft_emu_cuda_)")
    list(APPEND exported ${name})
  else()
    list(APPEND strays ${name})
  endif()
endforeach()
if(strays)
  list(JOIN strays "\n  " s)
  message(FATAL_ERROR "${LIB} exports symbols outside cuda*/cu*/weft_emu_cuda_*:\n  ${s}")
endif()
set(required cudaGetDeviceCount cudaMalloc cudaFree cudaPointerGetAttributes cudaMemcpyAsync
  cudaStreamCreateWithFlags cudaIpcGetMemHandle cudaIpcOpenMemHandle cudaIpcCloseMemHandle
  cudaGetDriverEntryPoint cudaGetDriverEntryPointByVersion cuStreamWaitValue32_v2
  cuStreamWriteValue32_v2 cuPointerGetAttribute cuPointerGetAttributes cuMemGetAddressRange_v2
  cuMemGetHandleForAddressRange cuGetErrorString weft_emu_cuda_stream_delay
  cuModuleLoadData cuModuleGetFunction cuModuleUnload cuLaunchKernel cuStreamGetCtx cuCtxPushCurrent_v2
  cuCtxPopCurrent_v2 cuCtxGetDevice)
foreach(fn IN LISTS required)
  if(NOT fn IN_LIST exported)
    message(FATAL_ERROR "${LIB} does not export ${fn}")
  endif()
endforeach()
list(LENGTH exported n)
message(STATUS "${LIB} exports ${n} symbols, all cuda*/cu*/weft_emu_cuda_*")
