# ctest label info: weft_info's own tests (test_weft_info.sh asserts the
# lines it prints). Each takes well under a second or two.
set(_wi ${CMAKE_CURRENT_SOURCE_DIR}/test_weft_info.sh)
set(_wi_mpi_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_btl_tcp_if_include=lo;OMPI_MCA_oob_tcp_if_include=lo")
foreach(c options native json)
  add_test(NAME info_${c} COMMAND ${_wi} ${c} $<TARGET_FILE:weft_info>)
  set_tests_properties(info_${c} PROPERTIES LABELS info TIMEOUT 60
    ENVIRONMENT "WEFT_TCP_IF=lo;WEFT_TYPO_VARIABLE=1")
endforeach()
add_test(NAME info_cma_off COMMAND ${_wi} cma_off $<TARGET_FILE:weft_info>)
set_tests_properties(info_cma_off PROPERTIES LABELS info TIMEOUT 60 ENVIRONMENT "WEFT_SHM_CMA=0")
if(TARGET weft_emu_cuda AND TARGET weft_emu_verbs AND NOT WEFT_TEST_CUDA_RUNTIME STREQUAL "real")
  add_test(NAME info_emu COMMAND ${_wi} emu $<TARGET_FILE:weft_info>)
  set_tests_properties(info_emu PROPERTIES LABELS "info;emu" TIMEOUT 60
    ENVIRONMENT "WEFT_CUDA_LIB=$<TARGET_FILE:weft_emu_cuda>;WEFT_IBVERBS_LIB=$<TARGET_FILE:weft_emu_verbs>;WEFT_TOPO_XML=${PROJECT_SOURCE_DIR}/tests/topo/2gpu-2nic.xml;WEFT_EMU_CUDA_BUSIDS=0000:04:00.0,0000:08:00.0")
endif()
# Under mpirun: the transport weft's selection gave each pair.
set(_wi_pairs "pairs_shm\;3\;" "pairs_vnodes2\;3\;WEFT_VIRTUAL_NODES=2" "pairs_tcp\;2\;WEFT_TRANSPORTS=tcp")
foreach(p IN LISTS _wi_pairs)
  list(GET p 0 c)
  list(GET p 1 np)
  list(GET p 2 extra)
  add_test(NAME info_${c}_np${np} COMMAND ${_wi} ${c} $<TARGET_FILE:weft_info> ${MPIEXEC_EXECUTABLE} ${np})
  set_tests_properties(info_${c}_np${np} PROPERTIES LABELS "info;mpi" TIMEOUT 120 PROCESSORS ${np}
    ENVIRONMENT "${_wi_mpi_env};WEFT_TCP_IF=lo;WEFT_TIMEOUT=60;${extra}")
endforeach()
# Review T1 (top CMakeLists.txt): this folder's entries that set WEFT_CUDA_LIB.
weft_check_cuda_runtime_tests()
